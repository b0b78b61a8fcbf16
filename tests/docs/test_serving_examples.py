"""Every example of docs/serving.md runs against a `deepx-flow serve --model-repository` this
test starts, holding the `mlp` the examples use: its curl commands (bash) and its Python
programs, as a reader would paste them."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.test_contract_examples import _json_answers
from tests.gateway.test_serve import Served
from tests.onnx.test_onnx_import import mlp_model

DOC = Path(__file__).resolve().parents[2] / "docs" / "serving.md"
EXAMPLES = re.findall(r"```(bash|python)\n(.*?)```", DOC.read_text(), re.S)


def test_the_doc_has_examples_of_both_kinds():
    kinds = [kind for kind, _ in EXAMPLES]
    assert kinds.count("bash") >= 2 and kinds.count("python") >= 2


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("serving-doc")
    (root / "models" / "mlp" / "1").mkdir(parents=True)
    mlp_model(root / "models" / "mlp" / "1" / "model.onnx")
    server = Served(root, "--model-repository", str(root / "models"))
    yield {**os.environ, "DEEPX_URL": server.url, "DEEPX_GRPC": server.grpc}
    assert server.stop() == 0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind, code", EXAMPLES, ids=[f"{k}-{i}" for i, (k, _) in
                                                      enumerate(EXAMPLES)])
def test_the_example_runs(served, kind, code, tmp_path):
    if kind == "bash":
        if shutil.which("curl") is None:
            pytest.fail("curl is not installed (.ci/run installs it)")
        command = ["bash", "-e", "-o", "pipefail", "-c", code]
    else:
        command = [sys.executable, "-c", code]
    done = subprocess.run(command, env=served, capture_output=True, text=True, timeout=240,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout.strip()
    assert out, "the example printed nothing"
    for answer in _json_answers(out):
        assert "error" not in answer, answer["error"]
