"""Every example of docs/contract.md runs against a gateway this test starts: its curl
commands (bash) and its Python programs, as a reader would paste them, with DEEPX_URL and
DEEPX_GRPC pointing at that gateway."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gateway.test_serve import Served

DOC = Path(__file__).resolve().parents[2] / "docs" / "contract.md"
BLOCK = re.compile(r"```(bash|python)\n(.*?)```", re.S)
EXAMPLES = BLOCK.findall(DOC.read_text())


def test_the_doc_has_examples_of_both_kinds():
    kinds = [kind for kind, _ in EXAMPLES]
    assert kinds.count("bash") >= 4 and kinds.count("python") >= 3


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    gateway = Served(tmp_path_factory.mktemp("gateway"))
    env = {**os.environ, "DEEPX_URL": gateway.url, "DEEPX_GRPC": gateway.grpc}
    yield env
    assert gateway.stop() == 0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind, code", EXAMPLES, ids=[f"{k}-{i}" for i, (k, _) in
                                                      enumerate(EXAMPLES)])
def test_the_example_runs(served, kind, code, tmp_path):
    if kind == "bash":
        if shutil.which("curl") is None:
            pytest.fail("curl is not installed (.ci/run installs it)")
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], env=served,
                              capture_output=True, text=True, timeout=240, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        out = done.stdout.strip()
        assert out, "the example printed nothing"
        for answer in _json_answers(out):  # each JSON answer: not an error
            assert "error" not in answer, answer["error"]
            assert answer.get("state", "succeeded") == "succeeded", answer
    else:
        done = subprocess.run([sys.executable, "-c", code], env=served, capture_output=True,
                              text=True, timeout=240, cwd=tmp_path)
        assert done.returncode == 0, done.stderr


def _json_answers(out: str) -> list:
    """The JSON objects an example printed one after another (none for other output)."""
    decoder, answers, at = json.JSONDecoder(), [], 0
    while out.startswith("{", at):
        answer, at = decoder.raw_decode(out, at)
        answers.append(answer)
        while at < len(out) and out[at].isspace():
            at += 1
    return answers
