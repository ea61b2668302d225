"""URLs and the credentials they must not carry. Everything a user names (data paths, prepare's source
and output, storage options) is saved with the run or shown in its output, so credentials inside it are
refused before anything is written; they belong in the environment or in fsspec's own config."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from bigbatch.errors import BigbatchError

# Where credentials go instead, for the messages that refuse them.
WHERE_CREDENTIALS_GO = (
    "give them through the environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, for S3) or "
    "fsspec's own config (~/.config/fsspec/*.json)"
)
# Storage options (at any depth) and URL query parameters whose values are secrets.
CREDENTIAL_KEYS = {"key", "secret", "token", "password", "session_token", "aws_access_key_id", "aws_secret_access_key"}
CREDENTIAL_PARAMS = ("token", "signature", "sig", "secret", "password", "credential", "key")


def is_url(path: str) -> bool:
    """True for fsspec URLs such as s3://bucket/key (not for local paths or file://)."""
    scheme = urlsplit(str(path)).scheme
    return len(scheme) > 1 and scheme != "file"


def public_name(src: str) -> str:
    """`src` as it may be written to files and logs: no user, password or query string."""
    if not is_url(src):
        return str(src)
    parts = urlsplit(src)
    return urlunsplit((parts.scheme, parts.hostname or "", parts.path, "", ""))


def url_credentials(value: str) -> str | None:
    """What in a URL is a credential ("user:password@", "?X-Amz-Signature=", ...), or None. Never the secret."""
    if "://" not in str(value):
        return None
    try:
        parts = urlsplit(str(value))
        parts.port  # noqa: B018 (raises ValueError for a malformed netloc)
    except ValueError:  # e.g. user:password@host read as host:port
        return "user info (user:password@)" if "@" in str(value).split("://", 1)[1].split("/", 1)[0] else None
    if parts.username is not None or parts.password is not None:
        return "user info (user:password@)"
    for name, _ in parse_qsl(parts.query, keep_blank_values=True):
        if any(p in name.lower() for p in CREDENTIAL_PARAMS):
            return f"the query parameter {name}"
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
    for k, v in options.items():
        name = prefix + str(k)
        if (keys and str(k).lower() in CREDENTIAL_KEYS) or (isinstance(v, str) and url_credentials(v)):
            found.append(name)
        if isinstance(v, dict):
            found += option_credentials(v, keys, f"{name}.")
    return found
