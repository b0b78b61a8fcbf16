"""The C/C++ SDK (sdks/cpp): built once with CMake (libdeepx, its tests, the conformance runner
and two programs that call a model, one in C++ and one in C through the C API alone), its
C++ and C tests pass under ctest against a real gateway over HTTP and gRPC, its conformance
runner fails a case whose graph or results differ, the model trained and packaged in Python
answers C and C++ as it answers Python, and a table with one more operator, regenerated,
gives the library a method for it that runs on a gateway."""

import json
import os
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import toolchain
from tests.sdks.test_extra_operator import X, _want, regenerated  # noqa: F401
from tests.sdks.trained_model import trained  # noqa: F401  (a real gateway serving a model)
from tests.sdks.wrong_cases import unsaid, write_wrong_cases

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "sdks" / "cpp"
SUITE = ROOT / "sdks" / "conformance"


def _cmake(source: Path, build: Path, *options: str, target: str = "all") -> float:
    """Configures and builds source into build (two jobs); the seconds it took. Build type
    None: no optimization, which halves the build, most of these tests' time (what they
    run waits on the gateway)."""
    cmake = toolchain("cmake")
    toolchain("g++")
    started = time.monotonic()
    for command in ([cmake, "-S", str(source), "-B", str(build), "-DCMAKE_BUILD_TYPE=None",
                     *options], [cmake, "--build", str(build), "-j2", "--target", target]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return time.monotonic() - started


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A build of sdks/cpp (every target), once for this module."""
    build = tmp_path_factory.mktemp("deepx-cpp")
    seconds = _cmake(SDK, build)
    print(f"sdks/cpp built in {seconds:.0f} s")
    return build


def _env(served) -> dict:
    return {**os.environ, "DEEPX_URL": served.url, "DEEPX_GRPC": served.grpc}


@pytest.mark.timeout(1200)
def test_the_sdks_tests_pass_under_ctest_against_a_gateway(built, trained):  # noqa: F811
    done = subprocess.run([toolchain("ctest"), "--output-on-failure", "-V"], cwd=built,
                          capture_output=True, text=True, timeout=600, env=_env(trained))
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "100% tests passed, 0 tests failed out of 3" in done.stdout, done.stdout[-3000:]
    passed = re.findall(r"--- PASS: (\w+)", done.stdout)
    assert not re.findall(r"--- (?:SKIP|FAIL): (\w+)", done.stdout), done.stdout[-4000:]
    # graph_test's 11, client_test's 9 (each over HTTP and gRPC: among them a run longer
    # than one exchange's wait, and a cancel from a second thread), c_api_test's 5 (among
    # them runs followed, listed and cancelled, and an asset defined, materialized and read)
    assert len(passed) == 25 and len(set(passed)) == 25, passed
    counts = re.findall(r"^\d+: (\d+) passed, (\d+) failed, (\d+) skipped$", done.stdout, re.M)
    assert sorted(counts) == sorted([("11", "0", "0"), ("9", "0", "0"), ("5", "0", "0")])


@pytest.mark.timeout(1200)
def test_the_runner_fails_a_case_whose_graph_or_results_differ(built, trained, tmp_path):  # noqa: F811
    said = write_wrong_cases(tmp_path)
    done = subprocess.run([str(built / "conformance"), str(tmp_path)], capture_output=True,
                          text=True, timeout=300, env=_env(trained))
    assert done.returncode == 1, done.stdout + done.stderr
    for transport in ("http", "grpc"):
        assert f"cpp {transport}: 1 passed, {len(said)} failed" in done.stdout, done.stdout
        lines = "\n".join(line for line in done.stdout.splitlines() if f"({transport})" in line)
        assert unsaid(lines, said) == [], done.stdout


@pytest.mark.timeout(1200)
def test_the_model_trained_in_python_answers_c_and_cpp_as_python(built, trained):  # noqa: F811
    rows, columns = trained.x.shape
    values = [repr(float(v)) for v in trained.x.ravel()]
    for program in ("call_model", "call_model_c"):  # (C++, and C through the C API)
        for url in (trained.url, "grpc://" + trained.grpc):
            done = subprocess.run([str(built / program), url, trained.model, trained.input,
                                   trained.output, str(rows), str(columns), *values],
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, (program, url, done.stderr)
            got = np.array([float(v) for v in done.stdout.split()], np.float32)
            np.testing.assert_allclose(got.reshape(trained.want.shape), trained.want, rtol=1e-6,
                                       err_msg=f"{program} {url}")


SOFTSIGN = """#include <iomanip>
#include <iostream>
#include "deepx/deepx.hpp"

int main(int argc, char** argv) {
  deepx::Graph g;
  g.output(g.softsign(g.input("x", {4}), {{"scale", 2}}), "y");
  deepx::Client client(argv[1]);
  auto done = client.execute(g, {{"x", deepx::Values({4}, std::vector<float>{%s})}});
  std::cout << std::setprecision(9) << "[";
  for (float v : done.outputs.at("y").data<float>()) std::cout << v << ",";
  std::cout << "0]" << std::endl;
}
"""

# The same from C: the C API's generic call checks the operator against the library's table
# (this checkout's library refuses softsign as an unknown operator).
SOFTSIGN_C = """#include <stdio.h>
#include <stdlib.h>
#include "deepx/deepx.h"

static void check(int status) {
  if (status != DEEPX_OK) {
    fprintf(stderr, "%%s: %%s\\n", deepx_error_kind(), deepx_error_message());
    exit(1);
  }
}

int main(int argc, char** argv) {
  deepx_client* client;
  deepx_graph* g;
  deepx_values* x;
  deepx_operation* done;
  const char *in, *out;
  int64_t shape[] = {4};
  float data[] = {%s};
  check(deepx_client_new(argv[1], NULL, &client));
  check(deepx_graph_new(&g));
  check(deepx_graph_input(g, "x", shape, 1, "float32", &in));
  check(deepx_graph_op(g, "softsign", &in, 1, "{\\"scale\\": 2}", &out));
  check(deepx_graph_output(g, out, "y"));
  check(deepx_values_new("float32", shape, 1, data, sizeof data, &x));
  check(deepx_client_execute(client, g, &in, (const deepx_values* const*)&x, 1, NULL, &done));
  const float* y = deepx_values_data(deepx_operation_output(done, "y"));
  printf("[%%.9g,%%.9g,%%.9g,%%.9g]\\n", y[0], y[1], y[2], y[3]);
  return 0;
}
"""


@pytest.mark.timeout(1200)
def test_a_regenerated_sdk_has_the_extra_operator_and_the_gateway_runs_it(regenerated):  # noqa: F811
    root, server = regenerated
    assert "softsign" not in (SDK / "include" / "deepx" / "generated" /
                              "operators.hpp").read_text()
    program = root / "softsign-cpp"
    program.mkdir()
    (program / "main.cpp").write_text(SOFTSIGN % ", ".join(f"{v}f" for v in X))
    (program / "main.c").write_text(SOFTSIGN_C % ", ".join(f"{v}f" for v in X))
    # programs of their own on the regenerated library (HTTP alone: no gRPC to compile)
    (program / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(softsign C CXX)\n"
        "set(DEEPX_GRPC OFF CACHE BOOL \"\")\nset(DEEPX_TESTS OFF CACHE BOOL \"\")\n"
        f"add_subdirectory({root / 'sdks' / 'cpp'} deepx)\n"
        "add_executable(softsign main.cpp)\ntarget_link_libraries(softsign PRIVATE deepx)\n"
        "add_executable(softsign_c main.c)\ntarget_link_libraries(softsign_c PRIVATE deepx)\n")
    _cmake(program, program / "build", target="all")
    for name, tail in (("softsign", 1), ("softsign_c", 0)):  # (C++'s list ends with a 0)
        done = subprocess.run([str(program / "build" / name), server.url],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (name, done.stderr)
        got = json.loads(done.stdout)
        np.testing.assert_allclose(got[:len(got) - tail], _want(2.0), rtol=1e-6, err_msg=name)
