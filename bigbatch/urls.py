"""URLs and the credentials they must not carry. Everything a user names (data paths, prepare's source
and output, storage options) is saved with the run or shown in its output, so credentials inside it are
refused before anything is written; they belong in the environment or in fsspec's own config."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bigbatch.errors import BigbatchError

# Where credentials go instead, for the messages that refuse them.
WHERE_CREDENTIALS_GO = (
    "give them through the environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, for S3) or "
    "fsspec's own config (~/.config/fsspec/*.json)"
)
# Storage options (at any depth) whose values are secrets: these names, or names containing these parts.
# (Found from outside: HTTP headers' Authorization, an auth, sftp's pkey were saved in config.toml; review: not
# auth_timeout, gss_auth, authority or a User-Agent header, which hold none.)
CREDENTIAL_KEYS = {"key", "passphrase", "pkey", "creds", "auth", "authorization", "proxy-authorization", "proxy_auth"}
CREDENTIAL_KEYS |= {"basic_auth", "http_auth", "x-auth", "cookie", "cookies"}  # (and any name with a part below)
CREDENTIAL_PARTS = ("secret", "token", "password", "passwd", "credential", "_key", "-key", "apikey", "connection_str")
# URL query, fragment and ;parameter names holding secrets (a signed URL's signature, a SAS token...).
CREDENTIAL_PARAMS = ("token", "signature", "sig", "secret", "password", "passwd", "pw", "auth", "credential", "key")


def is_url(path: str) -> bool:
    """True for fsspec URLs such as s3://bucket/key (not for local paths or file://)."""
    m = re.match(r"([A-Za-z][A-Za-z0-9+.\-]*):", str(path))
    return m is not None and len(m.group(1)) > 1 and m.group(1).lower() != "file"


def names_url(path: str) -> bool:
    """Whether a path given where a local one is written names a URL: scheme://... (a local name may hold a colon,
    runs:v2)."""
    return "://" in path and is_url(path)


def file_path(text: str) -> str:
    """`text`, or the local path a file: URL names (RFC 8089: file:///abs, file://localhost/abs, file:/abs; %-escapes
    undone; a # or ? kept, as a file's name may hold them); a file: URL of another host, or of no absolute path,
    refused in one line (found from outside: each made a folder named file: in the working folder, and data paths and
    runs took fewer forms)."""
    if not re.match(r"(?i)file:", text):
        return text
    from urllib.parse import unquote

    rest, host = text[5:], ""
    if rest.startswith("//"):
        host, slash, rest = rest[2:].partition("/")
        rest = slash + rest
    if "@" in host:  # (user info: not shown)
        raise BigbatchError(f"a file: URL carries user info (user:password@): give a path on this machine, {rest}")
    if host not in ("", "localhost") or not rest.startswith("/"):
        where = f"names the host {host}" if host not in ("", "localhost") else "is not of an absolute path"
        raise BigbatchError(f"{text} {where}: give a path on this machine (file:///abs/path, or the path itself)")
    return unquote(rest)


def local_folder(value: str | os.PathLike, what: str, writer: str = "bigbatch") -> Path:
    """A path this process writes as local files (file:///abs: /abs); a URL (s3://...) refused in one line (found from
    outside: Path() made s3://b/runs the local folder ./s3:/b/runs, and a sweep and bigbatch.train trained there)."""
    return Path(local_path(value, what, writer))


def local_path(value: str | os.PathLike, what: str, writer: str = "bigbatch") -> str:
    """local_folder's path as the text given (a trailing / kept: a command may read it as a folder's)."""
    text = file_path(os.fspath(value))  # (found from outside: ./file:/... made; fsspec reads it so)
    if names_url(text):
        raise BigbatchError(
            f"{what} {text} is a URL, and {writer} writes local files: give a local path (and copy the result up "
            "afterwards)"
        )
    return text


def local_run(value: str | os.PathLike) -> Path:
    """A run (its folder, a checkpoint's, a DFL model folder) to read as local files; credentials in it, and a URL,
    refused in one line (found from outside: `sample s3://b/run` said "s3:/b/run does not exist")."""
    refuse_credentials(text := os.fspath(value), public_name(text))  # (first, as everywhere; its public name said)
    text = file_path(text)
    if names_url(text):
        raise BigbatchError(
            f"{public_name(text)} is a URL, and runs are read as folders on this machine: copy the run down first"
        )
    return Path(text)


def endpoint_options(endpoint_url: str | None, options: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """fsspec's storage `options` (a run's data.storage_options) with an S3 endpoint given on the command line
    (--endpoint-url) in place of theirs, the rest kept (found by review: a run's other options were dropped)."""
    if not endpoint_url:
        return options or None
    out = {k: v for k, v in (options or {}).items() if k != "endpoint_url"}
    return out | {"client_kwargs": {**out.get("client_kwargs", {}), "endpoint_url": endpoint_url}}


def _split(url: str) -> tuple[str, str | None, str, str]:
    """(scheme, user info or None, host and path, the rest: ;params, ?query, #fragment) of a URL, by
    hand: a secret may hold characters (/ [ #) that make urllib misread or reject the URL."""
    scheme, _, rest = str(url).partition("://")
    cut = re.search(r"[;?#]", rest)
    head, tail = (rest[: cut.start()], rest[cut.start() :]) if cut else (rest, "")
    first = head.split("/", 1)[0]
    if "@" in first:  # user:password@host
        i = first.rindex("@")
        return scheme, head[:i], head[i + 1 :], tail
    port = first.rpartition(":")[2] if ":" in first else ""
    if port and not port.strip("]").isdigit() and "@" in rest:  # user:pass/word@host: a '/' in the secret
        i = rest.rindex("@")
        cut = re.search(r"[;?#]", rest[i:])
        j = i + cut.start() if cut else len(rest)
        return scheme, rest[:i], rest[i + 1 : j], rest[j:]
    return scheme, None, head, tail


def public_name(src: str) -> str:
    """`src` as it may be written to files and logs: no user, password, parameters or query string, in each
    URL of an fsspec chain (zip://member::https://user:pass@host/f.zip)."""
    if not is_url(src) or "://" not in str(src):
        return str(src)
    if "::" in str(src):
        return "::".join(public_name(part) for part in str(src).split("::"))
    scheme, _, head, _ = _split(src)
    return f"{scheme}://{head}"


def url_credentials(value: str) -> str | None:
    """What in a URL is a credential ("user:password@", "?X-Amz-Signature=", ...), or None, in each URL of an
    fsspec chain. Never the secret."""
    if "::" in str(value):
        return next(filter(None, (url_credentials(part) for part in str(value).split("::"))), None)
    if "://" not in str(value):
        return None
    _, user, _, tail = _split(str(value))
    if user is not None:
        return "user info (user:password@)"
    for item in re.split(r"[;?#&]", tail):
        name = item.partition("=")[0]
        if name and any(p in name.lower() for p in CREDENTIAL_PARAMS):
            return f"the parameter {name}"
    return None


def refuse_credentials(value: str, where: str) -> None:
    """Raise a BigbatchError if the URL `value` carries credentials (`where` names the setting)."""
    found = url_credentials(value)
    if found:
        raise BigbatchError(
            f"{where} carries credentials in its URL ({found}), which bigbatch would write to its files and show; "
            f"drop them from {public_name(value)} and {WHERE_CREDENTIALS_GO}"
        )


def option_credentials(options: dict[str, Any], keys: bool = True, prefix: str = "") -> list[str]:
    """Dotted names of the entries of fsspec storage options that hold credentials: a URL carrying some
    (client_kwargs.endpoint_url = "http://u:p@host") and, with `keys`, a credential key (key, secret,
    token, ...: refused where the options are saved, as in a config; the Python API may pass them)."""
    found = []
    items = options.items() if isinstance(options, dict) else enumerate(options)
    for k, v in items:
        name = prefix + str(k)
        secret_name = str(k).lower() in CREDENTIAL_KEYS or any(p in str(k).lower() for p in CREDENTIAL_PARTS)
        if (keys and secret_name) or (isinstance(v, str) and url_credentials(v)):
            found.append(name)
        if isinstance(v, (dict, list, tuple)):  # (lists too: found from outside)
            found += option_credentials(v, keys, f"{name}.")
    return found


def unreachable(error: BaseException, what: str) -> str | None:
    """What fsspec's FileNotFoundError stands for where it is not a missing file (its HTTP file system's `info` says
    "not found" of anything but an answer): "cannot reach WHAT (...): is its server up?" of a server that did not
    answer (found from outside, called missing), "cannot read WHAT: its server answered HTTP 403" of a status other
    than 404 (found by review, called missing); else None."""
    cause = error.__cause__
    if not isinstance(error, FileNotFoundError):
        return None
    if isinstance(cause, OSError):
        return f"cannot reach {what} ({cause}): is its server up?"
    status = getattr(cause, "status", None)  # (aiohttp's ClientResponseError)
    if isinstance(status, int) and status != 404:
        return f"cannot read {what}: its server answered HTTP {status}"
    return None


def url_fix(error: BaseException) -> str | None:
    """The fix for a URL's read that failed for want of range requests, credentials or an endpoint that answers,
    else None (found from outside: a server without range requests was told to check credentials; an S3 endpoint
    that did not answer, after botocore's retries, was given no fix)."""
    said, kind = str(error), type(error).__name__
    if "range requests" in said:
        return (
            "its server takes no HTTP range requests, which reading it in place needs: serve it elsewhere, or download"
        )
    if kind == "NoCredentialsError":  # (botocore's: found from outside, unhinted where prepare's source hinted it)
        return "give the object store's credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
    if isinstance(error, (ConnectionError, TimeoutError)) or "Connect" in kind or "Endpoint" in kind:
        return (
            "check the endpoint and the network: AWS_ENDPOINT_URL, --endpoint-url, data.storage_options' endpoint_url"
        )
    return None


@dataclass(frozen=True)
class Location:
    """A path or URL a user named (a source of images, a data file), parsed once where it enters: a URL's
    credentials refused, its public name kept. The layers below take it and ask it, not the string again."""

    text: str
    """As given, credentials refused (a URL's other parameters kept); a local path without file://."""
    url: bool
    """An fsspec URL (s3://bucket/key), not a local path."""
    name: str
    """What files and logs may show (public_name)."""

    @classmethod
    def of(cls, value: str | os.PathLike | Location, what: str = "") -> Location:
        """`value` parsed (a Location as it is); credentials in it refused, naming it as `what` (default: its
        public name)."""
        if isinstance(value, Location):
            return value
        text = str(value)
        if not text.strip():  # (found from outside: Path("") is ".", so an unset variable prepared the working folder)
            raise BigbatchError(f"{what.strip() or 'a path'} is empty: give a file, folder or URL")
        refuse_credentials(text, what or public_name(text))
        if is_url(text):
            return cls(text, True, public_name(text))
        local = file_path(text)
        return cls(local, False, local)

    @property
    def path(self) -> Path:
        """The local path (a URL has none)."""
        if self.url:
            raise ValueError(f"{self.name} is a URL, not a local path")
        return Path(self.text)

    def fs(self, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
        """The fsspec filesystem and path of a URL; credentials come from `storage_options` or the
        environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL for S3)."""
        import fsspec

        try:
            return fsspec.core.url_to_fs(self.text, **(storage_options or {}))
        except ImportError as e:
            scheme = self.text.split("://", 1)[0]  # (found from outside: s3fs named for a gs:// URL)
            raise BigbatchError(f"cannot read {self.name}: {e} (fsspec's file system for {scheme}://)") from None
        except ValueError as e:
            raise BigbatchError(f"cannot read {self.name}: {e}") from None
        except OSError as e:  # (a filesystem that connects as it is made, ftp's: found from outside, the error alone)
            raise BigbatchError(f"cannot reach {self.name}: {e.strerror or e}") from None

    def __str__(self) -> str:
        return self.name
