"""The JavaScript SDK (sdks/javascript): its tests pass with Node, those against a real
gateway included (the gateway on loopback in this process, as tests/gateway/test_http_app.py
starts it)."""

import os
import re
import subprocess
from pathlib import Path

from tests.gateway.test_http_app import http  # noqa: F401  (the gateway on loopback)
from tests.helpers import toolchain

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "sdks" / "javascript"


def test_the_sdks_tests_pass_against_a_gateway(http):  # noqa: F811
    done = subprocess.run([toolchain("node"), "--test", "test/"], cwd=SDK, capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "DEEPX_URL": str(http.base_url).rstrip("/")})
    counts = dict(re.findall(r"^# (pass|fail|skipped) (\d+)$", done.stdout, re.M))
    assert done.returncode == 0 and counts.get("fail") == "0", done.stdout[-4000:]
    assert counts.get("skipped") == "0" and int(counts["pass"]) >= 10, counts
