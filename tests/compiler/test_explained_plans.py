"""The plan of every graph in graphs/ for every cluster in graphs/clusters/ is the one stored
in tests/compiler/explained/ (`Plan.explain()`, word for word): a change to the compiler that
moves a chunk, a task or a byte of any of them shows here, so a refactoring of a pass (the
partitioner as rules, issue 35) is proven to change nothing, and a change meant to move
them is seen and stored on purpose:

    DEEPX_UPDATE_EXPLAINED=1 pytest tests/compiler/test_explained_plans.py
"""

import os
from pathlib import Path

import pytest
import yaml

from deepx_flow.compiler.compile import compile_graph
from deepx_flow.registry.cluster import load_cluster_file
from deepx_flow.spec.reader import document_to_graph

ROOT = Path(__file__).resolve().parents[2]
STORED = Path(__file__).resolve().parent / "explained"
GRAPHS = sorted((ROOT / "graphs").glob("*.yaml"))
CLUSTERS = sorted((ROOT / "graphs" / "clusters").glob("*.yaml"))


def _explained(graph_file: Path, cluster_file: Path) -> str:
    graph = document_to_graph(yaml.safe_load(graph_file.read_text()))
    return compile_graph(graph, load_cluster_file(cluster_file)).explain() + "\n"


@pytest.mark.parametrize("cluster_file", CLUSTERS, ids=lambda p: p.stem)
@pytest.mark.parametrize("graph_file", GRAPHS, ids=lambda p: p.stem)
def test_the_plan_is_the_one_stored(graph_file, cluster_file):
    stored = STORED / f"{graph_file.stem}@{cluster_file.stem}.txt"
    text = _explained(graph_file, cluster_file)
    if os.environ.get("DEEPX_UPDATE_EXPLAINED"):
        STORED.mkdir(exist_ok=True)
        stored.write_text(text)
    assert stored.is_file(), f"no stored plan {stored.name}: run with DEEPX_UPDATE_EXPLAINED=1"
    assert text == stored.read_text()


def test_every_stored_plan_is_of_a_graph_and_cluster_here():
    made = {f"{g.stem}@{c.stem}.txt" for g in GRAPHS for c in CLUSTERS}
    assert {p.name for p in STORED.glob("*.txt")} == made and len(made) >= 21
