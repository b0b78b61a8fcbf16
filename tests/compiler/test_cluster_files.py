"""Cluster files: the shipped ones load; bad ones give one ClusterError naming the entry."""

from pathlib import Path

import pytest

import deepx_flow as dx
from deepx_flow.registry.cluster import cluster_from_dict


@pytest.mark.parametrize("path", sorted(Path("graphs/clusters").glob("*.yaml")))
def test_shipped_cluster_files_load(path):
    spec = dx.load_cluster_file(path)
    assert spec.workers and spec.task_budget() > 0


def test_h100_file_plans_with_gpu_memory():
    spec = dx.load_cluster_file("graphs/clusters/8xH100.yaml")
    assert len(spec.workers) == 8 and spec.has_devices
    assert spec.task_budget() == int(80 * 2**30 * 0.5)


@pytest.mark.parametrize("data,needle", [
    ({"workers": []}, "deepx_cluster: 1"),
    ({"deepx_cluster": 1, "workers": {"memory": "1GB"}}, "must be a list"),
    ({"deepx_cluster": 1, "workers": [{"threads": 2}]}, "entry 0 needs at least 'memory'"),
    ({"deepx_cluster": 1, "workers": [{"memory": "1GB", "threads": "abc"}]}, "'threads'"),
    ({"deepx_cluster": 1, "workers": [{"memory": "lots"}]}, "'lots'"),
    ({"deepx_cluster": 1, "workers": [{"memory": "1GB"}], "links": [{"scope": "host"}]},
     "needs 'bandwidth'"),
    ({"deepx_cluster": 1, "workers": [{"memory": "1GB"}], "links": [{"scope": "moon"}]},
     "'scope'"),
])
def test_bad_cluster_files(data, needle):
    with pytest.raises(dx.ClusterError, match=needle):
        cluster_from_dict(data, "c.yaml")


def test_missing_cluster_file():
    with pytest.raises(dx.ClusterError, match="nope.yaml does not exist"):
        dx.load_cluster_file("nope.yaml")
