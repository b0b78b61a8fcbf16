"""Task keys: Dask groups tasks by the first word of their key (its "task prefix") and keeps
statistics per prefix, so every key starts with its operator, also for nodes the user named;
and the node of a key is read back exactly, whatever its id.

Why: 5,000 named inputs used to be 5,000 task prefixes, and the scheduler's per-prefix
bookkeeping made a 5,000-way concat of them quadratic (over 90 s; issue 30, item 9)."""

from __future__ import annotations

import numpy as np
from dask.utils import key_split
from hypothesis import given
from hypothesis import strategies as st

import deepx_flow as dx
from deepx_flow.ir.keys import node_of, tensor_key
from deepx_flow.ir.node import make_id
from deepx_flow.ops import OPS
from tests.compiler.test_inline import lowered

ops = st.sampled_from(sorted(OPS))
tokens = st.text("0123456789abcdef", min_size=12, max_size=12)


@given(op=ops, node_id=st.text(min_size=1).filter(lambda s: "@" not in s), token=tokens,
       suffix=st.sampled_from(["", ".partial", ".sum"]))
def test_the_node_of_a_key_is_its_id_for_any_id(op, node_id, token, suffix):
    key = (tensor_key(node_id, op, token) + suffix, 0, 3)
    assert node_of(key) == node_id
    assert node_of(key[0]) == node_id


@given(op=ops, node_id=st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True),
       token=tokens)
def test_a_named_nodes_key_has_its_operator_as_task_prefix(op, node_id, token):
    assert key_split(tensor_key(node_id, op, token)) == op


@given(op=ops, token=tokens, kept_as=ops)
def test_a_generated_id_is_its_own_key(op, token, kept_as):
    # Also when the node that has it is of another operator now: a fused node keeps the id
    # of the node it grew from ("mul-..." of op "fused"), and its tasks that prefix.
    node_id = make_id(op, ("x",), (2, 3), "float32", ())
    assert tensor_key(node_id, kept_as, token) == f"{node_id}@{token}"
    assert key_split(tensor_key(node_id, kept_as, token)) == op


def test_many_named_inputs_share_one_task_prefix():
    n = 300
    xs = [dx.input(f"x{i}", (1, 8), "float64") for i in range(n)]
    values = {f"x{i}": np.full((1, 8), float(i)) for i in range(n)}
    plan, low = lowered(dx.concat(xs) * 2.0, 2**30, values)
    inputs = [k for k in low.dsk if node_of(k) in values]
    assert len(inputs) == n
    assert {key_split(k) for k in inputs} == {"input"}
    assert {node_of(k) for k in inputs} == set(values)
