"""The Go SDK (sdks/go): formatted as gofmt writes Go, vetted, and its tests pass with Go's
toolchain, those against a real gateway included (the gateway on loopback in this
process)."""

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.gateway.test_http_app import http  # noqa: F401  (the gateway on loopback)
from tests.helpers import GO_OFFLINE, toolchain

SDK = Path(__file__).resolve().parents[2] / "sdks" / "go"


@pytest.mark.timeout(600)
def test_the_go_sdk_is_formatted_vetted_and_its_tests_pass(http):  # noqa: F811
    tool = toolchain("go")  # (.ci/run installs Debian's golang-go)
    env = {**os.environ, "DEEPX_URL": str(http.base_url).rstrip("/"), **GO_OFFLINE}
    unformatted = subprocess.run([str(Path(tool).with_name("gofmt")), "-l", "."], cwd=SDK,
                                 capture_output=True, text=True, env=env)
    assert unformatted.returncode == 0 and unformatted.stdout == "", unformatted.stdout
    vetted = subprocess.run([tool, "vet", "./..."], cwd=SDK, capture_output=True, text=True,
                            env=env, timeout=300)
    assert vetted.returncode == 0, vetted.stderr
    done = subprocess.run([tool, "test", "-count=1", "-v", "./..."], cwd=SDK,
                          capture_output=True, text=True, env=env, timeout=500)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    passed = re.findall(r"^--- PASS: (\w+)", done.stdout, re.M)
    skipped = re.findall(r"^--- SKIP: (\w+)", done.stdout, re.M)
    assert not skipped and len(passed) >= 9, done.stdout[-3000:]
