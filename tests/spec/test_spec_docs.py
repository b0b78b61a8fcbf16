"""docs/graph-spec.md stays true: it documents every operator, and its examples read."""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import pytest

from deepx_flow.ops import OPS
from deepx_flow.ops.table import operator_table
from deepx_flow.spec import yaml_io

DOC = Path(__file__).resolve().parents[2] / "docs" / "graph-spec.md"


def test_every_operator_is_documented():
    text = DOC.read_text()
    missing = [name for name in list(OPS) + list(operator_table()) if f"`{name}`" not in text]
    assert not missing, f"add these operators to {DOC.name}: {missing}"


@pytest.mark.parametrize("block", [b for b in re.findall(r"```yaml\n(.*?)```", DOC.read_text(),
                                                         re.S) if b.startswith("deepx:")])
def test_complete_examples_in_the_doc_read(block):
    graph = yaml_io.from_yaml(block)
    assert graph.outputs


def test_docstring_examples():
    result = doctest.testmod(yaml_io, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 2 and result.failed == 0
