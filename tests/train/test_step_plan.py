"""A training step planned for a cluster we do not have (`dx.train(..., plan_only=True)`,
`deepx-flow explain` of a saved step spec): the placement, memory and predicted time, with
nothing computed."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import deepx_flow as dx
from deepx_flow.errors import GraphError, PlanError
from deepx_flow.registry.cluster import load_cluster_file
from deepx_flow.train.step_plan import StepPlan, peak_live_bytes, step_inputs

ROOT = Path(__file__).resolve().parents[2]
H100 = ROOT / "graphs/clusters/8xH100.yaml"


def mlp(widths):
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [dx.nn.Linear(a, b), dx.relu]
    return dx.nn.Sequential(*layers[:-1])


def loss_of(model):
    return lambda p, x, y: dx.nn.cross_entropy(model(p, x), y)


def test_a_model_of_tens_of_gigabytes_is_planned_without_computing_it():
    model = mlp([16384, 65536, 65536, 10])  # 5.4e9 parameters: 21 GB of float32
    x = np.zeros((4096, 16384), np.float32)
    y = np.zeros(4096, np.int64)
    plan = dx.train(loss_of(model), model.init(0), (x, y), batch_size=1024, plan_only=True,
                    cluster=H100)
    assert isinstance(plan, StepPlan)
    placed = plan.placement
    # parameters, gradients and Adam state replicated would need 4 x 21 GB on each GPU
    assert placed["2.weight"].strategy != "replicated"
    gpu = load_cluster_file(H100).workers[0].budget
    assert placed.kept <= placed.limit and plan.memory_per_worker <= gpu
    assert plan.placement.compute_seconds > 0 and plan.placement.step_seconds > 0
    text = plan.explain()
    assert "2.weight" in text and "memory per worker" in text and "predicted" in text
    assert "Plan for cluster '8xH100'" in text


def test_a_small_model_is_data_parallel_and_its_step_is_compute_bound_enough():
    model = mlp([256, 512, 10])
    x, y = np.zeros((65536, 256), np.float32), np.zeros(65536, np.int64)
    plan = dx.train(loss_of(model), model.init(0), (x, y), batch_size=65536, plan_only=True,
                    cluster=H100)
    assert set(plan.placement.strategies()) == {"replicated"}
    assert repr(plan).startswith("<StepPlan on '8xH100'")


def test_plan_only_checks_what_training_checks():
    model = mlp([4, 3])
    with pytest.raises(GraphError, match="only floating-point"):
        dx.train(loss_of(model), {"0.weight": np.zeros((4, 3), np.int32), "0.bias":
                                  np.zeros(3, np.float32)},
                 (np.zeros((8, 4), np.float32), np.zeros(8, np.int64)), batch_size=4,
                 plan_only=True, cluster=H100)


def test_a_saved_step_spec_is_explained_with_its_placement(tmp_path):
    model = mlp([64, 128, 10])
    x, y = np.zeros((512, 64), np.float32), np.zeros(512, np.int64)
    plan = dx.train(loss_of(model), model.init(0), (x, y), batch_size=128, plan_only=True,
                    cluster=H100)
    path = tmp_path / "step.yaml"
    plan.to_yaml(path)
    params, state = step_inputs(dx.from_yaml(path))
    assert sorted(params) == ["param_0", "param_1", "param_2", "param_3"]
    assert state["m/param_0"] == "state_m_0" and len(state) == 8
    done = subprocess.run([sys.executable, "-m", "deepx_flow.cli.main", "explain", str(path),
                           "--cluster", str(ROOT / "graphs/clusters/2x4xH200.yaml")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "parameters on 2x4xH200 (8 workers)" in done.stdout
    assert "param_2" in done.stdout and "memory per worker" in done.stdout
    plain = subprocess.run([sys.executable, "-m", "deepx_flow.cli.main", "explain",
                            str(ROOT / "graphs/mlp_forward.yaml"), "--cluster", str(H100)],
                           capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0 and "parameters on" not in plain.stdout


def test_live_bytes_follow_each_value_from_its_node_to_its_last_reader():
    x = dx.input("x", (4,))
    y = dx.exp(x)
    z = y + x
    graph = dx.build_graph(z)
    # x, then y beside it, then z beside both; x and y are let go after z
    assert peak_live_bytes(graph) == 3 * 16
    assert peak_live_bytes(graph, skip={"x"}) == 2 * 16
    w = dx.exp(dx.exp(dx.exp(x)))  # a chain: two values alive at once
    assert peak_live_bytes(dx.build_graph(w)) == 2 * 16


def test_a_step_whose_values_alone_do_not_fit_is_refused_saying_so(tmp_path):
    model = mlp([1024, 4096, 10])
    x, y = np.zeros((8192, 1024), np.float32), np.zeros(8192, np.int64)
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text("deepx_cluster: 1\nname: tiny\nworkers:\n  - {name: w, count: 2, "
                    "host: h, threads: 1, memory: 64MiB}\n")
    with pytest.raises(PlanError, match=r"live values alone need .* more than the 64\.0 MiB "
                                        r"of cluster 'tiny'\. Use a smaller batch"):
        dx.train(loss_of(model), model.init(0), (x, y), batch_size=8192, plan_only=True,
                 cluster=tiny)
