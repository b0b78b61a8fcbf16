"""Each kind's chunking rule alone (`compiler/chunking/`): which axes it joins with its
operands', keeps whole or sums over, and how it counts tasks and chunks; and the driver
(`compiler/partition.py`) that asks them, which names no kind of operator."""

import ast
from pathlib import Path

import deepx_flow as dx
from deepx_flow.compiler.chunking import BY_KIND, BY_OP, rule_for, task_count
from deepx_flow.compiler.chunking.classes import combined_tasks
from deepx_flow.compiler.chunking.layout import Concat, Layout, Reshape, Transpose
from deepx_flow.compiler.infer import infer_types
from deepx_flow.compiler.partition import joined_axes
from deepx_flow.config import settings
from deepx_flow.ir import Node
from deepx_flow.ops import OPS


def joined(outputs, join_whole_axes=True):
    graph = infer_types(dx.build_graph(outputs))
    return graph, joined_axes(graph, settings(), 2**30, join_whole_axes)


def same(s, a, b) -> bool:
    return s.classes.find(a) == s.classes.find(b)


def test_every_operator_has_a_rule_and_only_layouts_are_named():
    for name, spec in OPS.items():
        assert spec.kind in BY_KIND, name
    assert {OPS[name].kind for name in BY_OP} == {"layout"}


def test_elementwise_operands_are_chunked_as_the_result_they_broadcast_into():
    x, y = dx.input("x", (4, 3)), dx.input("y", (3,))
    z = x + y
    g, s = joined(z)
    assert same(s, ("x", 0), (z.node.id, 0)) and same(s, ("x", 1), (z.node.id, 1))
    assert same(s, ("y", 0), (z.node.id, 1))
    assert not same(s, ("x", 0), ("x", 1))
    rule = rule_for(z.node)
    assert rule.sets_grid and not rule.follows_users and rule.summed(z.node) == []


def test_matmul_joins_m_n_and_k_and_sums_over_k():
    a, b = dx.input("a", (6, 5)), dx.input("b", (5, 7))
    c = a @ b
    g, s = joined(c)
    node = g[c.node.id]
    k = (node.id + "#k", 0)
    assert same(s, ("a", 1), k) and same(s, ("b", 0), k)
    assert same(s, ("a", 0), (node.id, 0)) and same(s, ("b", 1), (node.id, 1))
    rule = rule_for(node)
    assert rule.summed(node) == [k] and k in rule.task_keys(node, s)
    s.classes.size[s.classes.find(k)] = 2  # K in chunks of 2, 2, 1
    assert rule.planned(node, s) == {"k_chunks": (2, 2, 1)}
    fanin = {}
    # one result chunk and three partials: three tiles, then one task that sums them
    assert rule.tasks(node, s, {node.id: (1, 1)}, fanin) == 3 + 1
    assert fanin[node.id] >= 2


def test_a_reduction_chunks_its_operand_space_and_sums_over_its_axes():
    x = dx.input("x", (6, 4))
    r = x.sum(axis=1)
    g, s = joined(r)
    node = g[r.node.id]
    space = node.id + "#in"
    assert s.spaces[space] == (6, 4)
    assert same(s, ("x", 0), (space, 0)) and same(s, (space, 0), (node.id, 0))
    assert not same(s, (space, 1), (node.id, 0))
    rule = rule_for(node)
    assert rule.summed(node) == [(space, 1)]
    assert rule.task_keys(node, s) == [(space, 0), (space, 1)]
    # one partial per result chunk is finished inside its task
    assert rule.task_count(3, 3, 4) == 3
    assert rule.task_count(6, 3, 4) == combined_tasks(6, 3, 4) == 6 + 3


def test_softmax_keeps_its_axis_whole_and_may_leave_the_operand_free_along_it():
    x = dx.input("x", (8, 5))
    y = dx.softmax(x, axis=1)
    g, s = joined(y)
    node = g[y.node.id]
    assert s.classes.whole_reason((node.id, 1)) == f"'{node.id}' (softmax)"
    assert same(s, ("x", 1), (node.id, 1))
    g, s = joined(y, join_whole_axes=False)
    assert not same(s, ("x", 1), (node.id, 1)) and same(s, ("x", 0), (node.id, 0))
    assert s.classes.whole_reason(("x", 1)) is None
    assert rule_for(node).frees_whole_axis


def test_a_scan_is_split_along_its_axis_last_and_counts_its_totals_and_carries():
    x = dx.input("x", (6, 9))
    y = dx.cumsum(x, axis=1)
    g, s = joined(y)
    node = g[y.node.id]
    rule = rule_for(node)
    assert same(s, ("x", 1), (node.id, 1))
    assert rule.split_last(node) == rule.summed(node) == [(node.id, 1)]
    # 2 lines of 3 chunks: per line, totals of 2 chunks and a carry of the third
    assert rule.task_count(6, 6, 2, along=3) == 6 + 2 * (2 + 1) == task_count("scan", 6, 6, 2, 3)


def test_take_chunks_its_result_as_x_around_the_indices_axes():
    x, i = dx.input("x", (5, 7, 2)), dx.input("i", (3,), "int64")
    y = dx.take(x, i, axis=1)
    g, s = joined(y)
    node = g[y.node.id]
    assert node.shape == (5, 3, 2)
    assert same(s, ("x", 0), (node.id, 0)) and same(s, ("i", 0), (node.id, 1))
    assert same(s, ("x", 2), (node.id, 2)) and not same(s, ("x", 1), (node.id, 1))


def test_a_convolution_joins_the_batch_keeps_channels_whole_and_splits_images_last():
    x = dx.input("x", (4, 3, 10, 10))
    w = dx.input("w", (8, 3, 3, 3))
    y = dx.nn.conv(x, w)
    g, s = joined(y)
    node = next(n for n in g.nodes if n.op == "conv")
    assert same(s, ("x", 0), (node.id, 0))
    assert s.classes.whole_reason((node.id, 1)) is not None
    assert rule_for(node).split_last(node) == [(node.id, 2), (node.id, 3)]


def test_layouts_set_no_grid_but_a_transpose_permutes_its_operands():
    x = dx.input("x", (4, 6))
    t, sl = x.T, x[1:3]
    g, s = joined([t, sl])
    assert isinstance(rule_for(t.node), Transpose) and rule_for(t.node).sets_grid
    assert same(s, ("x", 0), (t.node.id, 1)) and same(s, ("x", 1), (t.node.id, 0))
    assert type(rule_for(sl.node)) is Layout and not rule_for(sl.node).sets_grid
    assert not same(s, ("x", 0), (sl.node.id, 0)) and not same(s, ("x", 1), (sl.node.id, 1))


def test_a_reshape_keeps_its_trailing_axes_whole_and_prefers_whole_operand_rows():
    x = dx.input("x", (6, 4))
    flat = x.reshape((3, 8))      # 8 results per row, 4 per operand row: runs of 1 row
    same_rows = x.reshape((6, 2, 2))
    g, s = joined([flat, same_rows])
    assert isinstance(rule_for(flat.node), Reshape)
    assert s.classes.whole_reason((flat.node.id, 1)) is not None
    assert s.classes.step.get(s.classes.find((flat.node.id, 0)), 1) == 1
    assert same(s, ("x", 0), (same_rows.node.id, 0))
    y = dx.input("y", (4, 6)).reshape((8, 3))   # lcm(3, 6) / 3: two result rows per step
    g, s = joined(y)
    assert s.classes.step[s.classes.find((y.node.id, 0))] == 2


def test_a_concat_joins_small_pieces_along_its_axis():
    parts = [dx.input(f"p{i}", (2, 3)) for i in range(5)]
    c = dx.concat(parts, axis=0)
    g, s = joined(c)
    node = g[c.node.id]
    rule = rule_for(node)
    assert isinstance(rule, Concat)
    assert all(same(s, (p.node.id, 1), (node.id, 1)) for p in parts)
    assert [(p.node.id, 0) for p in parts] == rule.task_keys(node, s)[2:]
    chunks = {p.node.id: ((2,), (3,)) for p in parts}
    # min_chunk_bytes lets one chunk hold every row: the five pieces are one chunk
    assert rule.chunks(node, s, chunks) == ((10,), (3,))
    counts = {p.node.id: (1, 1) for p in parts}
    assert rule.chunk_counts(node, s, counts) == (1, 1)
    assert rule.chunk_of(node, s) == (10, 3)


def test_a_stored_array_names_its_chunks_and_a_source_follows_its_users():
    node = Node("z", "read_zarr", (), (100, 8), "float32",
                (("storage_chunks", (25, 8)), ("uri", "z.zarr")))
    rule = rule_for(node)
    assert rule.stored_chunks(node) == (25, 8) and rule.follows_users
    assert rule.stored_chunks(Node("x", "input", (), (100, 8), "float32")) is None


def test_scatter_and_element_gathers_follow_their_tiling():
    x = dx.input("x", (6, 4))
    i = dx.input("i", (6, 4), "int64")
    y = dx.scatter(x, i, x, axis=1)
    g, s = joined(y)
    node = g[y.node.id]
    assert OPS[node.op].kind == "indexed"
    assert same(s, ("x", 0), (node.id, 0))
    assert s.classes.whole_reason((node.id, 1)) is not None


def test_the_driver_names_no_kind_of_operator():
    """`compiler/partition.py` asks the rules: no kind constant, no `.kind`, no operator
    name compared."""
    source = (Path(dx.__file__).parent / "compiler" / "partition.py").read_text()
    tree = ast.parse(source)
    kinds = {"SOURCE", "ELEMENTWISE", "MATMUL", "REDUCE", "AXIS_WHOLE", "SCAN", "LAYOUT",
             "GATHER", "WINDOW", "INDEXED"}
    named = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert not named & (kinds | {"get_op"})
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "kind"]
    compared = [side for n in ast.walk(tree) if isinstance(n, ast.Compare)
                for side in [n.left, *n.comparators]]
    assert not [n for n in compared if isinstance(n, ast.Attribute) and n.attr == "op"]
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
               and isinstance(n.value, str)}
    assert not strings & (set(OPS) | set(BY_KIND)), strings & (set(OPS) | set(BY_KIND))
