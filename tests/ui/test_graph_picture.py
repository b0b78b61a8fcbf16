"""The compiled graph's picture: built from graphs the SDK makes and the compiler compiles
(random ones, with hypothesis), every node gets one box, every edge points right, the
nodes of a fused kernel are exactly those its program computes, frames never hold another
kernel's box, and the chunk grids drawn add up to the plan's."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import deepx_flow as dx
from deepx_flow.compiler.compile import compile_graph
from deepx_flow.errors import PlanError
from deepx_flow.ir.program import describe
from deepx_flow.registry.cluster import ClusterSpec, WorkerSpec
from deepx_flow.ir.program import operator_label
from deepx_flow.sdk.build import build_graph
from deepx_flow.ui.graph_picture import (BOX_H, BOX_W, ID_LIMIT, box_name, canvas_size,
                                         extent, fused_members, grid_text, id_text, picture,
                                         shape_text)

UNARY = (dx.tanh, dx.exp, dx.relu, dx.abs)


def cluster(memory: int, workers: int = 2) -> ClusterSpec:
    return ClusterSpec("test", tuple(WorkerSpec(f"w{i}", "h", 1, memory) for i in range(workers)))


@st.composite
def graphs(draw):
    """Tensors of a random program: elementwise chains, scalars, matmuls, reductions, with
    some intermediate results kept as outputs (which stops fusion through them)."""
    rows, cols = draw(st.sampled_from([(64, 16), (256, 32), (512, 8)]))
    pool = [dx.random.normal((rows, cols), seed=draw(st.integers(0, 3)))]
    outputs = {}
    for step in range(draw(st.integers(1, 12))):
        x = draw(st.sampled_from(pool))
        kind = draw(st.sampled_from(["unary", "scalar", "binary", "matmul", "reduce"]))
        if kind == "unary":
            y = draw(st.sampled_from(UNARY))(x)
        elif kind == "scalar":
            y = x * draw(st.sampled_from([2.0, 0.5])) + 1.0
        elif kind == "binary":
            y = x + draw(st.sampled_from(pool))
        elif kind == "matmul":
            y = x @ dx.random.normal((cols, cols), seed=step)
        else:
            y = x.sum(axis=1, keepdims=True) * x
        pool.append(y)
        if draw(st.booleans()) and draw(st.booleans()):
            outputs[f"kept{step}"] = y
    outputs["out"] = pool[-1].sum(axis=0) if draw(st.booleans()) else pool[-1]
    return outputs


def compiled(outputs, memory: int):
    try:
        return compile_graph(build_graph(outputs), cluster(memory))
    except PlanError:  # a budget too small for some task: not this test's business
        assume(False)


def members_of(owner: dict) -> dict:
    out: dict = {}
    for node_id, kernel in owner.items():
        out.setdefault(kernel, []).append(node_id)
    return out


def computed_by(graph, kernel) -> list[str]:
    """The nodes of `graph` a kernel computes: back from it to its inputs."""
    found, todo = [], [kernel.id]
    while todo:
        node_id = todo.pop()
        if node_id in found or node_id not in graph:
            continue
        found.append(node_id)
        todo += [i for i in graph[node_id].inputs if i not in kernel.inputs]
    return found


def computed_ops(kernel) -> list[str]:
    """The operators a kernel's tasks run: its program's, and its own operator unless it
    is a plain fused program."""
    ops = [] if kernel.op == "fused" else [kernel.op]
    for part in ("program", "prologue", "epilogue"):
        ops += [op for op, _, _ in kernel.attr(part) or ()]
    return sorted(ops)


MEMORY = st.sampled_from([1 << 30, 1 << 20, 256 << 10])
RANDOM = settings(max_examples=60, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@RANDOM
@given(graphs(), MEMORY)
def test_each_kernel_owns_exactly_what_its_program_computes(outputs, memory):
    plan = compiled(outputs, memory)
    graph, fused = plan.graph, plan.fused
    owner = fused_members(graph, fused)
    members = members_of(owner)
    assert set(members) == {k.id for k in fused.nodes}
    for kernel in fused.nodes:
        # Every node its program computes, one the fusion recomputes in several kernels
        # (drawn with the first) included.
        mine = computed_by(graph, kernel)
        assert set(members[kernel.id]) <= set(mine)
        assert all(owner[m] == kernel.id or len([k for k in fused.nodes if m in
                                                 computed_by(graph, k)]) > 1 for m in mine)
        assert owner[kernel.id] == kernel.id
        # What the members read from outside the kernel is exactly the kernel's inputs
        # (a scalar constant two kernels inline as a literal belongs to the first).
        outside = {i for m in mine for i in graph[m].inputs
                   if i not in mine and not scalar(graph[i])}
        assert outside == set(kernel.inputs)
        # Its operators are the members' (scalar constants become literals in programs).
        ops = sorted(graph[m].op for m in mine if not scalar(graph[m]))
        assert ops == computed_ops(kernel), describe(kernel.attr("program") or ())
    # Only constants the fusion inlined nowhere (unused) are computed by no kernel.
    assert all(scalar(n) for n in graph.nodes if n.id not in owner)


def scalar(node) -> bool:
    return node.op == "full" and node.shape == ()


@RANDOM
@given(graphs(), MEMORY)
def test_the_picture_has_a_box_per_node_and_edges_point_right(outputs, memory):
    plan = compiled(outputs, memory)
    graph = plan.graph
    pic = picture(plan, label=operator_label)
    assert (pic.shown, pic.total) == (len(graph.nodes), len(graph.nodes))
    assert pic.nodes["id"] == [n.id for n in graph.nodes]
    at = {i: (x, y) for i, x, y in zip(pic.nodes["id"], pic.nodes["x"], pic.nodes["y"])}
    assert len(set(at.values())) == len(at)  # no two boxes in one place
    pairs = {(src, n.id) for n in graph.nodes for src in n.inputs}
    assert set(zip(pic.edges["source"], pic.edges["target"])) == pairs
    assert len(pic.edges["source"]) == len(pairs)
    for xs, src in zip(pic.edges["xs"], pic.edges["source"]):
        assert xs[0] == at[src][0] + BOX_W / 2 and xs[0] < xs[1]
    # Chunk grids: on every kernel's box, adding up to the plan's chunks.
    drawn = [math.prod(int(k) for k in c.split()[0].split("x"))
             for c in pic.nodes["chunks"] if c.endswith(("chunk", "chunks"))]
    assert sum(drawn) == sum(math.prod(len(c) for c in grid)
                             for grid in plan.partition.chunks.values())


@RANDOM
@given(graphs(), MEMORY)
def test_frames_hold_a_kernels_boxes_and_no_others(outputs, memory):
    plan = compiled(outputs, memory)
    pic = picture(plan, label=operator_label)
    kernels = {n.id: n for n in plan.fused.nodes}
    owner = fused_members(plan.graph, plan.fused)
    members = members_of(owner)
    kernels_drawn = [(operator_label(kernels[k]), len(m)) for k, m in members.items()
                     if len(m) > 1]
    assert sorted(zip(pic.groups["name"], pic.groups["members"])) == sorted(kernels_drawn)
    # Two kernels can compute the same thing (and so have one name): their members together.
    grouped = {}
    for k, m in members.items():
        if len(m) > 1:
            grouped.setdefault(operator_label(kernels[k]), set()).update(m)
    frames = list(zip(pic.frames["name"], pic.frames["left"], pic.frames["right"],
                      pic.frames["bottom"], pic.frames["top"]))
    for node_id, x, y, group in zip(pic.nodes["id"], pic.nodes["x"], pic.nodes["y"],
                                    pic.nodes["group"]):
        holding = {name for name, left, right, bottom, top in frames
                   if left < x < right and bottom < y < top}
        if group:
            assert node_id in grouped[group]
            assert group in holding  # inside a frame of its own kernel
            assert any(left <= x - BOX_W / 2 and x + BOX_W / 2 <= right and
                       bottom <= y - BOX_H / 2 and y + BOX_H / 2 <= top
                       for name, left, right, bottom, top in frames if name == group)
        assert holding <= {group}  # and in no other kernel's


def test_the_seed_runs_graph_fuses_tanh_mul_and_the_constant_into_the_sum():
    x = dx.random.normal((400, 64), seed=3, dtype="float64")
    plan = compile_graph(build_graph((dx.tanh(x) * 2.0).sum(axis=0)), cluster(1 << 30))
    pic = picture(plan, label=operator_label)
    ops = dict(zip(pic.nodes["op"], pic.nodes["chunks"]))
    assert ops == {"random_normal": "1x1 chunk", "tanh": "fused", "full": "fused",
                   "mul": "fused", "sum": "1 chunk"}
    assert pic.groups["name"] == ["sum+prologue[mul(tanh(in0), 2.0)]"]
    assert pic.groups["members"] == [4]
    # The constant is drawn next to mul, under tanh: one frame holds the four.
    assert len(pic.frames["name"]) == 1
    by_op = dict(zip(pic.nodes["op"], pic.nodes["text"]))
    ids = dict(zip(pic.nodes["op"], pic.nodes["id"]))
    # Each box: its name (the output's, else its id as the plan's tables name it), operator,
    # shape, chunk grid.
    assert by_op["random_normal"] == f"{ids['random_normal']}\nrandom_normal\n400x64\n1x1 chunk"
    assert by_op["sum"] == "out0\nsum\n64\n1 chunk"  # names=None: every output's is shown
    assert all(i in plan.explain() for i in (ids["random_normal"], ids["sum"]))


def test_a_long_node_id_keeps_its_start_and_its_hash():
    assert id_text("sum-ad3479f9fda1") == "sum-ad3479f9fda1"
    long = "batch_normalization-0123456789ab"
    shown = id_text(long)
    assert len(shown) == ID_LIMIT and shown.endswith("456789ab") and shown.startswith("batch_")
    assert "\u2026" in shown


def test_a_capped_picture_draws_the_first_nodes_and_says_how_many():
    x = dx.random.normal((64, 8), seed=1)
    for _ in range(30):
        x = dx.tanh(x) + 1.0
    plan = compile_graph(build_graph(x), cluster(1 << 30))
    pic = picture(plan, limit=10)
    assert (pic.shown, pic.total) == (10, len(plan.graph.nodes))
    assert pic.nodes["id"] == [n.id for n in plan.graph.nodes[:10]]
    # The first nodes read only each other: every edge drawn has both ends drawn.
    drawn = set(pic.nodes["id"])
    assert set(pic.edges["source"]) | set(pic.edges["target"]) <= drawn


@pytest.mark.parametrize("chunks, text", [
    ((), "1 chunk"), (((4,),), "1 chunk"), (((2, 2),), "2 chunks"),
    (((64,) * 4, (16,)), "4x1 chunks"), (((8, 8), (3, 3, 2)), "2x3 chunks")])
def test_grid_text(chunks, text):
    assert grid_text(chunks) == text


def test_shape_text():
    assert (shape_text(()), shape_text((16000, 256)), shape_text((7,))) == \
        ("scalar", "16000x256", "7")


def test_the_figure_names_its_sources():
    x = dx.random.normal((64, 8), seed=1)
    plan = compile_graph(build_graph(dx.exp(x) * 2.0 + x), cluster(1 << 30))
    fig = picture_figure(plan)
    from bokeh.models import ColumnDataSource
    names = {m.name for m in fig.select({"type": ColumnDataSource})}
    assert {"graph-nodes", "graph-edges", "graph-groups", "graph-frames"} <= names


def picture_figure(plan):
    from deepx_flow.ui.graph_picture import figure
    return figure(picture(plan, label=operator_label))


def test_two_kernels_that_compute_the_same_thing_are_two_frames_of_one_name():
    """Found by hypothesis in CI: two outputs fused into identical kernels."""
    x = dx.random.uniform((64, 16), seed=1, dtype="float32")
    a = dx.random.uniform((64, 16), seed=2, dtype="float32")
    plan = compiled({"kept0": x * 2.0 + 1.0, "out": a * 2.0 + 1.0}, 1 << 30)
    pic = picture(plan, label=operator_label)
    assert pic.groups["name"] == ["fused[add(mul(in0, 2.0), 1.0)]"] * 2
    members = members_of(fused_members(plan.graph, plan.fused))
    assert sorted(pic.groups["members"]) == sorted(len(m) for m in members.values()
                                                   if len(m) > 1)


def test_a_box_is_named_as_the_user_named_its_node():
    """By an input's name, a spec's node id, an output's name; by its content-hash id only
    when the user gave it no name (boxes said "mean-79ebfcb84f8b" for a training's loss)."""
    x = dx.input("pixels", (64, 8), "float32")
    w = dx.random.normal((8, 4), seed=1, dtype="float32")
    hidden = dx.relu(x @ w)
    plan = compile_graph(build_graph({"loss": hidden.mean(), "scores": hidden,
                                      "out0": hidden.sum()}), cluster(1 << 30))
    pic = picture(plan, label=operator_label, names={"loss": "loss", "scores": "scores",
                                                      "out0": None})
    first_line = {i: t.split("\n")[0] for i, t in zip(pic.nodes["id"], pic.nodes["text"])}
    by_output = {out: node for out, node in plan.graph.outputs}
    assert first_line["pixels"] == "pixels"
    assert first_line[by_output["loss"]] == "loss"
    assert first_line[by_output["scores"]] == "scores"
    assert first_line[by_output["out0"]] == id_text(by_output["out0"])  # made up: its id
    assert first_line[w.node.id] == id_text(w.node.id)  # anonymous: its hash
    assert dict(zip(pic.nodes["id"], pic.nodes["name"]))[by_output["loss"]] == "loss"
    assert box_name("sum-ad3479f9fda1", ["a", "b"]) == "a, b"
    assert box_name("h", ["y"]) == "h"  # a spec's id is the user's own
    assert box_name("sum-ad3479f9fda1", []) == "sum-ad3479f9fda1"


def test_the_figure_holds_the_whole_graph_at_a_readable_scale_or_smaller_to_fit():
    x = dx.random.normal((64, 8), seed=1)
    for _ in range(12):  # a long chain: far wider than a window
        x = dx.tanh(x @ dx.random.normal((8, 8), seed=2))
    plan = compile_graph(build_graph(x), cluster(1 << 30))
    pic = picture(plan, label=operator_label)
    left, right, bottom, top = extent(pic)
    assert left < min(pic.nodes["x"]) - BOX_W / 2 and max(pic.nodes["x"]) + BOX_W / 2 < right
    assert bottom < min(pic.nodes["y"]) - BOX_H / 2 and max(pic.nodes["y"]) + BOX_H / 2 < top
    assert all(left <= f <= right for f in pic.frames["left"] + pic.frames["right"])
    width, height = canvas_size(pic)
    assert width == pytest.approx((right - left) * 60, abs=1)  # 60 pixels per unit
    assert width > 3000
    fig = picture_figure(plan)
    assert (fig.x_range.start, fig.x_range.end) == (left, right)
    assert (fig.y_range.start, fig.y_range.end) == (bottom, top)
    assert (fig.width, fig.height) == (width, height)
    half = (width // 2, height)  # too big for that canvas: drawn at half the scale
    small = canvas_size(pic, limit=half)
    assert small[0] == half[0] and small[1] == pytest.approx(max(160, height / 2), abs=1)
