"""`deepx-flow ops` lists what the README's operator list names: every name there is an
operator in its first table or a function in its second (`dx.argmax`, `dx.nn.layer_norm`,
...), and every public function of `dx`, `dx.nn` and `dx.random` that builds tensors is in
one of the two. Which table a function is in is the code's business (`dx.cumsum` may be
either), not this test's."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import deepx_flow as dx
from deepx_flow.cli.main import main

README = Path(__file__).resolve().parents[2] / "README.md"
NAME = re.compile(r"^(?:dx\.)?(?:(?:nn|random)\.)?[a-z_][a-z0-9_]*$")


def ops_listing(capsys) -> dict[str, set[str]]:
    """The first column of each table `deepx-flow ops` prints, by the table's first header
    ("operator", "function")."""
    assert main(["ops"]) == 0
    lines = capsys.readouterr().out.splitlines()
    tables: dict[str, set[str]] = {}
    for i, line in enumerate(lines):
        if i and line and set(line) <= {"-", " "}:  # a header's rule: the rows follow
            rows = tables.setdefault(lines[i - 1].split()[0], set())
            for row in lines[i + 1:]:
                if not row.strip() or not NAME.match(row.split()[0]):
                    break
                rows.add(row.split()[0])
    return tables


def readme_operator_names() -> list[str]:
    """The names in the backquoted spans of the README's "- Operators:" item."""
    text = README.read_text()
    start = text.index("\n- Operators:")
    end = text.index("\n- ", start + 1)
    spans = [s for s in re.findall(r"`([^`]+)`", text[start:end])
             if not s.startswith("deepx-flow ")]  # a command
    return [word for span in spans for word in re.split(r"[\s/]+", span) if word]


def test_every_name_of_the_readmes_operator_list_is_listed(capsys):
    tables = ops_listing(capsys)
    operators, functions = tables["operator"], tables["function"]
    assert {"matmul", "sum", "relu"} <= operators and "dx.nn.layer_norm" in functions
    unlisted = []
    names = readme_operator_names()
    assert {"argmax", "dx.pad", "cumsum", "dx.nn.leaky_relu"} <= set(names)  # parsed
    for word in names:
        if word.startswith("t.") and hasattr(dx.Tensor, word[2:]):  # a method (`t.astype`)
            continue
        if not NAME.match(word):  # an expression (`x[a:b:c, i, None, ...]`)
            continue
        name = word.split(".")[-1]
        if word in functions or (name in operators and _is_there(word)):
            continue
        if "." not in word and any(f.split(".")[-1] == word for f in functions):
            continue  # `layer_norm`, after `dx.nn.batch_norm`
        unlisted.append(word)
    assert not unlisted, f"README.md names {unlisted}, which `deepx-flow ops` does not list"


def _is_there(word: str) -> bool:
    """A dotted name (`dx.nn.conv`) names something that exists; a bare one is an operator."""
    if "." not in word:
        return True
    *path, name = word.split(".")[1:]
    namespace = dx
    for part in path:
        namespace = getattr(namespace, part)
    return hasattr(namespace, name)


def test_every_function_that_builds_tensors_is_listed(capsys):
    tables = ops_listing(capsys)
    listed = tables["operator"] | tables["function"]
    for prefix, module in [("dx", dx), ("dx.nn", dx.nn), ("dx.random", dx.random)]:
        for name in module.__all__:
            fn = getattr(module, name)
            if inspect.isfunction(fn) and "Tensor" in str(
                    inspect.signature(fn).return_annotation):
                assert name in tables["operator"] or f"{prefix}.{name}" in listed, \
                    f"{prefix}.{name}"
    # The ones the issue found missing (issue 30, item 14).
    for name in ["dx.argmax", "dx.argmin", "dx.cumsum", "dx.pad", "dx.clip",
                 "dx.nn.batch_norm", "dx.nn.layer_norm", "dx.nn.instance_norm",
                 "dx.nn.group_norm", "dx.nn.conv_transpose", "dx.nn.leaky_relu",
                 "dx.nn.global_avg_pool", "dx.nn.global_max_pool"]:
        assert name in listed or name.split(".")[-1] in tables["operator"], name
