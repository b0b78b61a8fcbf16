"""The README names every `deepx-flow` command and each of its verbs (`assets verify`,
`onnx export`, ...), read from the command's own parser; and docs/graph-spec.md's operator
tables name every operator, and only operators."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from deepx_flow.cli.main import _parser
from deepx_flow.ops import OPS
from deepx_flow.ops.table import operator_table

ROOT = Path(__file__).resolve().parents[2]


def commands(parser: argparse.ArgumentParser, path=()) -> list[tuple[str, ...]]:
    """Every command path of `parser`: ("run",), ("assets", "verify"), ..."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append((*path, name))
                found += commands(sub, (*path, name))
    return found


def test_the_readme_names_every_command_and_verb():
    text = " ".join((ROOT / "README.md").read_text().split())
    said: dict[str, set[str]] = {}
    for command, verbs in re.findall(r"deepx-flow ([a-z]+)(?: ([a-z|]+))?", text):
        said.setdefault(command, set()).update(verbs.split("|") if verbs else ())
    every = commands(_parser())
    assert ("assets", "verify") in every and ("onnx", "export") in every  # the walk works
    missing = [" ".join(p) for p in every if p[0] not in said
               or (len(p) == 2 and p[1] not in said[p[0]])]
    assert not missing, f"README.md does not mention deepx-flow {missing}"


def test_the_spec_documents_every_operator():
    text = (ROOT / "docs" / "graph-spec.md").read_text()
    start = text.index("\n## Operators\n")
    end = text.find("\n## ", start + 1)
    named = set()
    for line in text[start:end if end > 0 else None].splitlines():
        if line.startswith("| `"):  # a row: its first cell names the operators
            named |= set(re.findall(r"`([a-z_0-9]+)`", line.split("|")[1]))
    known = set(OPS) | set(operator_table())  # (the table adds the composites)
    assert sorted(set(OPS) - named) == [], "operators docs/graph-spec.md does not document"
    assert sorted(named - known) == [], "docs/graph-spec.md documents no such operators"
