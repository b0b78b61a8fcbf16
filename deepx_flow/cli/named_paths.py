"""What the commands that run a graph share: their NAME=PATH arguments (an input read from a
file, an output written to one) and the line each output is reported in."""

from __future__ import annotations

from deepx_flow.errors import InputError


def named_paths(values, what: str) -> dict[str, str]:
    """`--what NAME=PATH` arguments as {name: path}; an InputError for one of another form."""
    out = {}
    for value in values or []:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise InputError(f"--{what} expects NAME=PATH, got {value!r}")
        out[name] = path
    return out


def report(name: str, value, path: str | None) -> None:
    """Save an output to its `.npy` path, or say its range; one line either way."""
    import numpy as np
    if path is not None:
        np.save(path, value)
        where = f"-> {path}"
    else:
        where = f"min {value.min() if value.size else '-'} max " \
                f"{value.max() if value.size else '-'}"
    print(f"{name}: shape {value.shape} {value.dtype} {where}")
