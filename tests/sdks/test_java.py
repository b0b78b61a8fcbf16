"""The Java SDK (sdks/java): it builds with the JDK's tools and Debian's gson, its JUnit tests
pass against a real gateway (on loopback in this process), its conformance runner fails a
case whose graph or results differ, a table with one more operator regenerated gives it a
method that runs, and the model trained and packaged in Python answers it as it answers
Python."""

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.gateway.test_http_app import http  # noqa: F401  (the gateway on loopback)
from tests.helpers import toolchain
from tests.sdks.test_extra_operator import X, _want, regenerated  # noqa: F401
from tests.sdks.trained_model import trained  # noqa: F401
from tests.sdks.wrong_cases import unsaid, write_wrong_cases

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "sdks" / "java"
JUNIT = Path("/usr/share/java/junit-platform-console-standalone.jar")


def _installed(path: Path) -> Path:
    """A jar of Debian's (.ci/run installs them); skip where missing, or fail where
    DEEPX_REQUIRE_SDK_TOOLCHAINS says it must be there."""
    if not path.is_file():
        if os.environ.get("DEEPX_REQUIRE_SDK_TOOLCHAINS"):
            pytest.fail(f"{path} is not installed (DEEPX_REQUIRE_SDK_TOOLCHAINS is set)")
        pytest.skip(f"{path} is not installed")
    return path


def _build(sdk: Path, out: Path) -> str:
    """sdks/java built by its build.sh into `out`: the class path to run it with."""
    toolchain("javac")
    _installed(Path("/usr/share/java/gson.jar"))
    done = subprocess.run(["bash", str(sdk / "build.sh"), str(out)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return (out / "classpath").read_text().strip()


@pytest.fixture(scope="module")
def classpath(tmp_path_factory):
    """The SDK, its tests and its conformance runner, built once for this module."""
    return _build(SDK, tmp_path_factory.mktemp("java-build"))


def _java_program(classpath: str, source: str, name: str, folder: Path, url: str) -> str:
    """What a Java program (one source file, run by `java` as it is) prints."""
    (folder / f"{name}.java").write_text(source)
    done = subprocess.run([toolchain("java"), "-cp", classpath, f"{name}.java"], cwd=folder,
                          capture_output=True, text=True, timeout=240,
                          env={**os.environ, "DEEPX_URL": url})
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.timeout(600)
def test_the_sdk_builds_and_its_tests_pass_against_a_gateway(http, classpath):  # noqa: F811
    done = subprocess.run([toolchain("java"), "-jar", str(_installed(JUNIT)), "-cp", classpath,
                           "--select-package", "dev.deepx.flow", "--disable-banner",
                           "--disable-ansi-colors", "--details=tree"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "DEEPX_URL": str(http.base_url).rstrip("/")})
    counts = {kind: int(n) for n, kind in
              re.findall(r"^\[\s+(\d+) tests (\w+)\s+\]$", done.stdout, re.M)}
    assert done.returncode == 0 and counts.get("failed") == 0, done.stdout[-6000:]
    assert counts["skipped"] == 0 and counts["aborted"] == 0, counts
    assert counts["found"] == counts["successful"] >= 21, counts


def test_the_runner_fails_a_case_or_scenario_whose_graph_or_results_differ(http, classpath, tmp_path):  # noqa: F811,E501
    said = write_wrong_cases(tmp_path)
    done = subprocess.run([toolchain("java"), "-cp", classpath,
                           "dev.deepx.flow.conformance.Conformance", str(tmp_path)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DEEPX_URL": str(http.base_url).rstrip("/")})
    assert done.returncode == 1
    assert f"java http: 1 passed, {len(said)} failed" in done.stdout, done.stdout
    assert unsaid(done.stdout, said) == [], done.stdout


def test_this_checkouts_java_sdk_has_no_softsign():
    assert "softsign" not in (SDK / "src" / "main" / "java" / "dev" / "deepx" / "flow" /
                              "GraphOperators.java").read_text()


@pytest.mark.timeout(300)
def test_this_checkouts_java_sdk_finds_the_gateways_table_is_another(regenerated, classpath,  # noqa: F811
                                                                       tmp_path):
    _, server = regenerated
    out = _java_program(classpath, """
import dev.deepx.flow.*;

public class Check {
  public static void main(String[] args) {
    try {
      new Client(System.getenv("DEEPX_URL")).checkServer();
    } catch (DeepxException e) {
      System.out.println(e.kind() + " " + e.getMessage());
    }
  }
}
""", "Check", tmp_path, server.url)
    assert out.strip() == (
        f"RemoteError {server.url} has another operator table than this SDK: missing none; "
        "not in this SDK softsign (upgrade one side)")


@pytest.mark.timeout(600)
def test_java_regenerated_has_the_new_operator_and_the_gateway_runs_it(regenerated, tmp_path):  # noqa: F811
    root, server = regenerated
    classpath = _build(root / "sdks" / "java", tmp_path / "build")
    out = _java_program(classpath, f"""
import dev.deepx.flow.*;
import java.util.Arrays;
import java.util.Map;

public class Softsign {{
  public static void main(String[] args) {{
    Client client = new Client(System.getenv("DEEPX_URL"));
    client.checkServer(); // (the same table as the gateway's: no complaint)
    Graph g = new Graph();
    g.output(g.softsign(g.input("x", 4), Map.of("scale", 2)), "y");
    Operation done = client.execute(g,
        Map.of("x", Values.of(new float[] {{{", ".join(f"{v}f" for v in X)}}})));
    System.out.println(Arrays.toString(done.outputs().get("y").floats()));
  }}
}}
""", "Softsign", tmp_path, server.url)
    np.testing.assert_allclose(json.loads(out), _want(2.0), rtol=1e-6)


@pytest.mark.timeout(600)
def test_the_model_trained_in_python_answers_java_as_it_answers_python(trained, classpath,  # noqa: F811
                                                                         tmp_path):
    rows = ", ".join(f"{v!r}f" for v in trained.x.ravel().tolist())
    out = _java_program(classpath, f"""
import dev.deepx.flow.*;
import java.util.Arrays;
import java.util.Map;

public class Iris {{
  public static void main(String[] args) {{
    Values rows = Values.of(new float[] {{{rows}}}, {trained.x.shape[0]}, {trained.x.shape[1]});
    Operation answer = new Client(System.getenv("DEEPX_URL"))
        .infer("{trained.model}", Map.of("{trained.input}", rows));
    Values probs = answer.outputs().get("{trained.output}");
    System.out.println(Arrays.toString(probs.shape()));
    System.out.println(Arrays.toString(probs.floats()));
  }}
}}
""", "Iris", tmp_path, trained.url)
    shape, values = out.splitlines()
    assert json.loads(shape) == list(trained.want.shape)
    got = np.array(json.loads(values), np.float32).reshape(trained.want.shape)
    np.testing.assert_allclose(got, trained.want, rtol=1e-6)
