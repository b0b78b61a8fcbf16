"""The JavaScript SDK (sdks/javascript): its tests pass with Node against a real gateway
(`deepx-flow serve` on loopback), over HTTP and over gRPC; the gRPC client's packages are
npm's (`npm ci` in sdks/javascript, as .ci/run does)."""

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.gateway.test_serve import Served
from tests.helpers import toolchain

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "sdks" / "javascript"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("javascript-sdk")
    (root / "models").mkdir()  # (a repository with no model: a model called is not found)
    server = Served(root, "--model-repository", str(root / "models"))
    yield server
    assert server.stop() == 0


def grpc_packages() -> None:
    """The gRPC client's packages are installed (skipped, or failed under
    DEEPX_REQUIRE_SDK_TOOLCHAINS, where not)."""
    if not (SDK / "node_modules" / "@grpc" / "grpc-js").is_dir():
        message = "the JavaScript SDK's packages are not installed (npm ci in sdks/javascript)"
        if os.environ.get("DEEPX_REQUIRE_SDK_TOOLCHAINS"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.mark.timeout(300)
def test_the_sdks_tests_pass_against_a_gateway_over_http_and_grpc(served):
    node = toolchain("node")
    grpc_packages()
    done = subprocess.run([node, "--test", "test/"], cwd=SDK, capture_output=True,
                          text=True, timeout=240,
                          env={**os.environ, "DEEPX_URL": served.url, "DEEPX_GRPC": served.grpc})
    counts = dict(re.findall(r"^# (pass|fail|skipped) (\d+)$", done.stdout, re.M))
    assert done.returncode == 0 and counts.get("fail") == "0", done.stdout[-4000:]
    assert counts.get("skipped") == "0" and int(counts["pass"]) >= 21, counts
