"""BIGBATCH_IMPORT: the modules that register a user's own model families (`@bigbatch.models.register`), imported by
every `bigbatch` command before it reads a config, so that the command line, torchrun's ranks and a launcher's know
the family (found from outside: `sample`, `eval`, `export`, `info` and a resume of such a run, and a sweep's runs
through Dask, were refused as naming no model family)."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

from bigbatch.errors import BigbatchError

ENV = "BIGBATCH_IMPORT"
PATH_ENV = "BIGBATCH_IMPORT_PATH"  # folders to find them in besides sys.path (os.pathsep-separated): a launcher's
CARRIED = (ENV, PATH_ENV)  # ranks are given where the launcher found them (found by review: in the ranks' own folder)


def named() -> list[str]:
    """The modules BIGBATCH_IMPORT names (comma-separated)."""
    return [name.strip() for name in os.environ.get(ENV, "").split(",") if name.strip()]


def import_user_modules() -> None:
    """Import the modules BIGBATCH_IMPORT names, from the working folder too (as `python -m` finds them); one that
    cannot be found is one line (an error inside it is the user's own traceback)."""
    if not named():
        return
    folders = [os.getcwd()] + [f for f in os.environ.get(PATH_ENV, "").split(os.pathsep) if f]
    sys.path[:0] = [f for f in folders if f not in sys.path and not (f == os.getcwd() and "" in sys.path)]
    for name in named():
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is None or not (name == e.name or name.startswith(e.name + ".")):  # (one it imports: theirs)
                raise
            raise BigbatchError(
                f"{ENV}={os.environ[ENV]}: no module {name} here (from {os.getcwd()} or PYTHONPATH): give the module "
                "that registers your model family, where Python finds it"
            ) from None


def carried_to_ranks(family_module: str, family: str) -> None:
    """Before a launcher starts ranks of a user's own family: BIGBATCH_IMPORT names its module and
    BIGBATCH_IMPORT_PATH the folder it is in (the ranks, given this process's, import it from there); a family
    registered in a script itself (__main__) is refused in one line, as no rank can import it."""
    if family_module == "__main__":
        raise BigbatchError(
            f"model family '{family}' is registered in the script that runs (__main__), which a launcher's ranks "
            f"cannot import: move it into a module of its own (e.g. mymodels.py) and import that"
        )
    if family_module not in named():
        os.environ[ENV] = ",".join([*named(), family_module])
    file = getattr(sys.modules.get(family_module), "__file__", None)
    if file:  # (the folder its top package is in: where this process found it)
        root = str(Path(file).resolve().parents[family_module.count(".")])
        folders = [f for f in os.environ.get(PATH_ENV, "").split(os.pathsep) if f]
        if root not in folders:
            os.environ[PATH_ENV] = os.pathsep.join([*folders, root])
