"""Finding a project's `dx.Definitions` from the command line (`-m my_pipeline`).

The target is a module name (`my_pipeline`, `pkg.pipeline`) or a Python file
(`pipelines/daily.py`), optionally followed by `:attribute`. Without an attribute the module
must hold exactly one `Definitions` object (conventionally named `defs`).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from deepx_flow.errors import InputError


def load_definitions(target: str):
    """The `Definitions` that `target` names; InputError saying what is wrong otherwise."""
    from deepx_flow.assets.definition import Definitions

    where, _, attribute = target.partition(":")
    module = _import(where)
    if attribute:
        found = getattr(module, attribute, None)
        if not isinstance(found, Definitions):
            raise InputError(f"{where}: {attribute!r} is not a dx.Definitions object"
                             if found is not None else f"{where} has no {attribute!r}")
        return found
    found = {name: value for name, value in vars(module).items()
             if isinstance(value, Definitions)}
    if len(found) != 1:
        raise InputError(f"{where} defines {len(found) or 'no'} dx.Definitions objects"
                         + (f" ({', '.join(sorted(found))})" if found else "")
                         + "; name one as MODULE:ATTRIBUTE")
    return next(iter(found.values()))


def _import(where: str):
    if where.endswith(".py") or "/" in where:
        path = Path(where)
        if not path.is_file():
            raise InputError(f"definitions file {where} does not exist")
        name = f"deepx_definitions_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # so dataclasses and pickling find it
        # The file's folder on the path, as `python file.py` would have it.
        folder = str(path.resolve().parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        _run(lambda: spec.loader.exec_module(module), where)
        return module
    if str(Path.cwd()) not in sys.path and "" not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # `-m my_pipeline` from the project folder
    try:
        return importlib.import_module(where)
    except ModuleNotFoundError as err:
        if err.name and where.startswith(err.name):
            raise InputError(f"cannot import {where!r}: no such module (from "
                             f"{Path.cwd()})") from None
        raise InputError(f"importing {where}: {err}") from err
    except SyntaxError as err:
        raise InputError(f"{err.filename}:{err.lineno}: {err.msg}") from err


def _run(load, where: str) -> None:
    """Run a definitions file; a syntax error or a missing import is bad input (one line
    naming the file and line), not a failure while running."""
    try:
        load()
    except SyntaxError as err:
        raise InputError(f"{err.filename}:{err.lineno}: {err.msg}") from err
    except ImportError as err:
        raise InputError(f"importing {where}: {err}") from err
