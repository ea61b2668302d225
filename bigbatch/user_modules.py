"""BIGBATCH_IMPORT: the modules that register a user's own model families (`@bigbatch.models.register`), imported by
every `bigbatch` command before it reads a config, so that the command line, torchrun's ranks and a launcher's know
the family (found from outside: `sample`, `eval`, `export`, `info` and a resume of such a run, and a sweep's runs
through Dask, were refused as naming no model family)."""

from __future__ import annotations

import importlib
import os
import sys

from bigbatch.errors import BigbatchError

ENV = "BIGBATCH_IMPORT"


def named() -> list[str]:
    """The modules BIGBATCH_IMPORT names (comma-separated)."""
    return [name.strip() for name in os.environ.get(ENV, "").split(",") if name.strip()]


def import_user_modules() -> None:
    """Import the modules BIGBATCH_IMPORT names, from the working folder too (as `python -m` finds them); one that
    cannot be found is one line (an error inside it is the user's own traceback)."""
    if not named():
        return
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in named():
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is None or not name.startswith(e.name):  # (a module it imports: the user's own error)
                raise
            raise BigbatchError(
                f"{ENV}={os.environ[ENV]}: no module {name} here (from {os.getcwd()} or PYTHONPATH): give the module "
                "that registers your model family, where Python finds it"
            ) from None


def carried_to_ranks(family_module: str, family: str) -> None:
    """Before a launcher starts ranks of a user's own family: BIGBATCH_IMPORT names its module (the ranks, which
    get this process's, import it); a family registered in a script itself (__main__) is refused in one line, as no
    rank can import it."""
    if family_module == "__main__":
        raise BigbatchError(
            f"model family '{family}' is registered in the script that runs (__main__), which a launcher's ranks "
            f"cannot import: move it into a module of its own (e.g. mymodels.py) and import that"
        )
    if family_module not in named():
        os.environ[ENV] = ",".join([*named(), family_module])
