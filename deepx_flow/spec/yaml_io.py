"""Read and write YAML graph specs: the cross-language protocol for tensor graphs.

A spec is a YAML mapping (`deepx: 1`, `inputs`, `nodes`, `outputs`; the format is described in
docs/graph-spec.md) that any language can write. `to_yaml` writes every node in full (id, op,
operand ids, shape, dtype, attributes), so `from_yaml(to_yaml(g)) == g` for every graph that
`build_graph` or `from_yaml` made; floats are written by `repr` and read back bit for bit.
`from_yaml` reads with a safe loader only (no Python objects can be built from a spec) that
bounds what the text may expand into (`deepx_flow.spec.bounded_yaml`: nesting, aliases, long
integers), then checks, orders and types the graph (`deepx_flow.spec.reader`).

Constants the SDK made from Python scalars (`x + 1.0`) are written back as literals in `args`
when reading the literal gives back the same node, so exported specs read like hand-written
ones.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from deepx_flow.config import settings
from deepx_flow.errors import GraphError, SpecError
from deepx_flow.ir import Graph
from deepx_flow.registry.cluster import format_bytes
from deepx_flow.sdk.build import Outputs, build_graph
from deepx_flow.spec import bounded_yaml
from deepx_flow.spec.reader import document_to_graph
from deepx_flow.spec.writer import graph_yaml

SUFFIXES = (".yaml", ".yml")


def from_yaml(source: str | os.PathLike) -> Graph:
    """Read a graph spec from a file or from YAML text.

    Parameters
    ----------
    source : str or path-like
        A `Path` (or any path-like) is always a file. A string is a file name when it has no
        newline and ends in `.yaml` or `.yml` or names an existing file; otherwise it is the
        spec's text.

    Returns
    -------
    Graph
        Validated and typed: every node has its shape and dtype. Nodes are in canonical order
        (depth-first from the outputs, as `build_graph` orders them); outputs are named and
        ordered as the spec's `outputs` list.

    Raises
    ------
    SpecError
        The file is missing or unreadable, the text is not YAML (the message gives the line),
        or it does not follow the format (version, keys, field types, undefined or duplicate
        ids, unknown outputs).
    GraphError
        The graph is wrong: unknown operator or attribute, a cycle, operands that do not fit,
        a stated shape or dtype that disagrees with the inferred one.

    Every message starts with the file name when the spec came from a file, and names the
    node, input or output at fault.

    Examples
    --------
    >>> g = from_yaml("graphs/mlp_forward.yaml")          # doctest: +SKIP
    >>> g = from_yaml("deepx: 1\\ninputs: {x: {shape: [4], dtype: float32}}\\noutputs: [x]")
    >>> g.outputs
    (('x', 'x'),)
    """
    limits = settings()
    text, path = _read_source(source, limits.max_spec_bytes)
    try:
        # Every value read becomes part of the graph: a collection would find nothing to
        # free (a 20,000-node spec reads in 1.7 s instead of 2.5).
        with bounded_yaml.collector_paused():
            return document_to_graph(_parse_yaml(text, limits.max_nodes))
    except GraphError as err:
        if path is None:
            raise
        # Same class and node, with the file in front: the CLI prints only the message.
        located = type(err)(f"{path}: {err}")
        located.node = err.node
        raise located.with_traceback(err.__traceback__) from None


def to_yaml(outputs: Outputs, path: str | os.PathLike | None = None, *,
            name: str | None = None, description: str | None = None) -> str:
    """Write the graph behind `outputs` as a spec; return the text.

    Parameters
    ----------
    outputs : Tensor, list or dict of Tensor, or Graph
        What to write; tensors are collected with `build_graph` (dict keys name the outputs).
    path : str or path-like, optional
        Also write the text to this file (UTF-8).
    name, description : str, optional
        Written as the spec's `name` and `description` (a Graph itself has neither).

    Returns
    -------
    str
        The spec. Reading it back with `from_yaml` gives a graph equal to
        `build_graph(outputs)` whenever that graph is in canonical order, as every graph
        built by the SDK or read by `from_yaml` is.

    Examples
    --------
    >>> import deepx_flow as dx
    >>> x = dx.input("x", (4, 3))
    >>> print(to_yaml({"y": (x * 2.0).sum(axis=1)}))  # doctest: +ELLIPSIS
    deepx: 1
    inputs:
      x:
        shape: [4, 3]
        dtype: float32
    nodes:
    - id: mul-...
      op: mul
      args: [x, 2.0]
    ...
    """
    text = graph_yaml(build_graph(outputs), name=name, description=description)
    if path is not None:
        Path(path).write_text(text, encoding="utf-8")
    return text


# -- reading -------------------------------------------------------------------------------
def _read_source(source: str | os.PathLike, max_bytes: int) -> tuple[str, str | None]:
    """The spec's text, and the file it came from (None for text); a SpecError for one of
    more than `max_bytes` bytes, found before it is parsed."""
    if isinstance(source, str) and not _is_file_name(source):
        # Checked without encoding a text far below the limit (UTF-8 takes up to 4 bytes).
        if len(source) * 4 > max_bytes and len(source.encode("utf-8", "replace")) > max_bytes:
            raise _too_large("the spec text", len(source.encode("utf-8", "replace")),
                             max_bytes)
        return source, None
    if not isinstance(source, (str, os.PathLike)):
        raise SpecError(f"from_yaml takes a file path or YAML text, not a "
                        f"{type(source).__name__}")
    path = os.fspath(source)
    try:
        with open(path, "rb") as file:
            # Read one byte past the limit: a file's stated size may be 0 (a pipe, /proc)
            # or change while it is read.
            size = os.fstat(file.fileno()).st_size
            if size > max_bytes:
                raise _too_large(path, size, max_bytes)
            data = file.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise _too_large(path, None, max_bytes)
        return data.decode("utf-8"), path
    except FileNotFoundError:
        raise SpecError(f"{path}: no such graph spec file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError(f"{path}: cannot read the graph spec: {err}") from None


def _too_large(what: str, size: int | None, max_bytes: int) -> SpecError:
    held = f"is {format_bytes(size)} ({size:,} bytes)" if size is not None else "holds more"
    return SpecError(f"{what}: {held}, more than the {format_bytes(max_bytes)} a graph spec "
                     f"may be (DEEPX_MAX_SPEC_BYTES={max_bytes}: raise it to read larger "
                     "specs)")


def _is_file_name(text: str) -> bool:
    if "\n" in text:
        return False
    return text.strip().endswith(SUFFIXES) or os.path.isfile(text)


def _parse_yaml(text: str, max_nodes: int) -> Any:
    try:
        return bounded_yaml.load(text, max_nodes)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = err.problem or err.context or "unreadable"
        # Parsers notice a missing bracket or quote only later; say where the construct began.
        if err.context and err.context_mark and err.problem_mark \
                and err.context_mark.line != err.problem_mark.line:
            problem += f" ({err.context} that starts at line {err.context_mark.line + 1})"
        raise SpecError(f"{where}invalid YAML: {problem}") from None
    except yaml.YAMLError as err:  # e.g. a character YAML does not allow: keep it one line
        raise SpecError(f"invalid YAML: {' '.join(str(err).split())}") from None
