"""The conformance suite (sdks/conformance): its cases are what Python makes now; its entry
point, run.sh, starts a gateway and every language's runner passes every case; and a
runner fails a case whose graph or results differ (so a pass means something)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gateway.test_http_app import http  # noqa: F401  (the gateway on loopback)
from tests.helpers import GO_OFFLINE, toolchain
from tests.sdks.wrong_cases import unsaid, write_wrong_cases

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "sdks" / "conformance"
CASES = sorted((SUITE / "cases").glob("*.json")) + sorted((SUITE / "scenarios").glob("*.json"))


@pytest.mark.parametrize("maker", ["make_cases.py", "make_scenarios.py"])
def test_the_cases_and_scenarios_are_current(maker):
    done = subprocess.run([sys.executable, str(SUITE / maker), "--check"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


# the transports each language's runner (sdks/<language>/conformance.sh) runs the cases over
TRANSPORTS = {"javascript": ["http", "grpc"], "go": ["http"], "java": ["http"], "lua": ["http"],
              "cpp": ["http", "grpc"]}
RUNNERS = sorted(p.parent.name for p in (ROOT / "sdks").glob("*/conformance.sh"))


def test_every_sdk_has_a_runner_and_its_transports_are_listed():
    assert RUNNERS and set(RUNNERS) <= set(TRANSPORTS)


@pytest.mark.timeout(1500)
def test_every_language_passes_every_case_against_one_gateway(capsys):
    done = subprocess.run(["bash", str(SUITE / "run.sh")], capture_output=True, text=True,
                          timeout=1400, env={**os.environ, "PYTHON": sys.executable})
    with capsys.disabled():  # (the counts, in CI's log as run.sh prints them)
        print("\n" + "\n".join(line for line in done.stdout.splitlines()
                                if re.match(r"\w+( \w+)?: ", line)))
    lines = dict(re.findall(r"^(\w+ \w+): (\d+ passed, \d+ failed)$", done.stdout, re.M))
    # a language, or one transport of it, whose toolchain is not here
    not_run = dict(re.findall(r"^(\w+(?: \w+)?): not run \((.*)\)$", done.stdout, re.M))
    if not_run and os.environ.get("DEEPX_REQUIRE_SDK_TOOLCHAINS"):
        pytest.fail(f"toolchains missing: {not_run}")
    ran = [f"{language} {transport}" for language in RUNNERS
           for transport in TRANSPORTS[language]
           if language not in not_run and f"{language} {transport}" not in not_run]
    if not ran:
        pytest.skip("no SDK toolchain is installed")
    assert lines == {line: f"{len(CASES)} passed, 0 failed" for line in ran}, done.stdout
    assert done.returncode == 0, done.stdout


def test_a_runner_fails_a_case_whose_graph_or_results_differ(http, tmp_path):  # noqa: F811
    node = toolchain("node")
    # (JavaScript's numbers are one kind: an int and a float written alike are one number)
    said = write_wrong_cases(tmp_path, leave_out=("wrong_number",))
    done = subprocess.run([node, str(ROOT / "sdks" / "javascript" / "conformance.mjs"),
                           str(tmp_path)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DEEPX_URL": str(http.base_url).rstrip("/")})
    assert done.returncode == 1
    assert f"javascript http: 1 passed, {len(said)} failed" in done.stdout, done.stdout
    assert unsaid(done.stdout, said) == [], done.stdout
    if shutil.which("go") is None:
        return
    said = write_wrong_cases(tmp_path)
    runner = tmp_path / "go-conformance"
    subprocess.run(["go", "build", "-o", str(runner), "./cmd/conformance"],
                   cwd=ROOT / "sdks" / "go", check=True, timeout=300,
                   env={**os.environ, **GO_OFFLINE})
    done = subprocess.run([str(runner), str(tmp_path)], capture_output=True, text=True,
                          timeout=120,
                          env={**os.environ, "DEEPX_URL": str(http.base_url).rstrip("/")})
    assert done.returncode == 1
    assert f"go http: 1 passed, {len(said)} failed" in done.stdout, done.stdout
    assert unsaid(done.stdout, said) == [], done.stdout
