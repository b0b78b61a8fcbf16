"""docs/sdks.md's quickstarts run as written, against a real `deepx-flow serve` with a model
repository (the models they call), each in its language's toolchain."""

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.gateway.test_serve import Served
from tests.helpers import GO_OFFLINE, toolchain
from tests.onnx.test_onnx_import import mlp_model

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "sdks.md"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("sdk-doc")
    (root / "models" / "mlp" / "1").mkdir(parents=True)
    mlp_model(root / "models" / "mlp" / "1" / "model.onnx")
    server = Served(root, "--model-repository", str(root / "models"))
    yield server
    assert server.stop() == 0


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.S)


@pytest.mark.timeout(300)
def test_the_javascript_quickstart_runs_as_written(served, tmp_path):
    node = toolchain("node")
    [code] = _blocks("js")
    # as `npm install /path/to/sdks/javascript` leaves it: the package in node_modules
    (tmp_path / "node_modules").mkdir()
    (tmp_path / "node_modules" / "deepx-flow").symlink_to(ROOT / "sdks" / "javascript")
    (tmp_path / "quickstart.mjs").write_text(code)
    done = subprocess.run([node, "quickstart.mjs"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=240, env={**os.environ, "DEEPX_URL": served.url})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # what the comments in the quickstart say each line prints
    said = re.findall(r"console\.log\(.*?\); // (.*)", code)
    assert lines == said, (lines, said)


@pytest.mark.timeout(600)
def test_the_go_quickstart_runs_as_written(served, tmp_path):
    go = toolchain("go")
    [code] = _blocks("go")
    # a module of its own using the SDK from this checkout, as the doc says to
    (tmp_path / "go.mod").write_text(
        "module quickstart\n\ngo 1.19\n\nrequire github.com/deepx-flow/deepx-go v0.0.0\n"
        f"replace github.com/deepx-flow/deepx-go => {ROOT / 'sdks' / 'go'}\n")
    (tmp_path / "main.go").write_text(code)
    done = subprocess.run([go, "run", "."], cwd=tmp_path, capture_output=True, text=True,
                          timeout=500, env={**os.environ, "DEEPX_URL": served.url,
                                            **GO_OFFLINE})
    assert done.returncode == 0, done.stderr
    said = re.findall(r"fmt\.Println\(.*?\) // (.*)", code)
    assert done.stdout.splitlines() == said, (done.stdout, said)


@pytest.mark.timeout(300)
def test_the_lua_quickstart_runs_as_written(served, tmp_path):
    lua = toolchain("lua5.4")
    [code] = _blocks("lua")
    (tmp_path / "quickstart.lua").write_text(code)
    # the module path as the doc's install step sets it
    sdk = ROOT / "sdks" / "lua"
    done = subprocess.run([lua, "quickstart.lua"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=240, env={**os.environ, "DEEPX_URL": served.url,
                                            "LUA_PATH": f"{sdk}/?.lua;{sdk}/?/init.lua;;"})
    assert done.returncode == 0, done.stderr
    # what the comments say each line prints (print's tabs shown as spaces)
    said = re.findall(r"print\(.*?\) -- (.*)", code)
    assert done.stdout.replace("\t", " ").splitlines() == said, (done.stdout, said)


@pytest.mark.timeout(600)
def test_the_java_quickstart_runs_as_written(served, tmp_path):
    from pathlib import Path

    java = toolchain("java")
    toolchain("javac")
    if not Path("/usr/share/java/gson.jar").is_file():  # (Debian's libgoogle-gson-java)
        if os.environ.get("DEEPX_REQUIRE_SDK_TOOLCHAINS"):
            pytest.fail("gson is not installed (DEEPX_REQUIRE_SDK_TOOLCHAINS is set)")
        pytest.skip("gson is not installed")
    [code] = _blocks("java")
    install = re.search(r"\n```\n(bash \S*sdks/java/build\.sh.*?)```", DOC.read_text(),
                        re.S).group(1)
    build, run = install.strip().splitlines()
    # the install lines as written, with this checkout for /path/to/deepx_flow
    built = subprocess.run(build.replace("/path/to/deepx_flow", str(ROOT)).split(),
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    (tmp_path / "Quickstart.java").write_text(code)
    done = subprocess.run([java if word == "java" else word for word in run.split()],
                          cwd=tmp_path, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "DEEPX_URL": served.url})
    assert done.returncode == 0, done.stderr
    said = re.findall(r"System\.out\.println\(.*?\); // (.*)", code)
    assert done.stdout.splitlines() == said, (done.stdout, said)


@pytest.mark.timeout(900)
def test_the_cpp_and_c_quickstarts_run_as_written(served, tmp_path):
    toolchain("cmake")
    toolchain("g++")
    [code] = _blocks("cpp")
    [c_code] = _blocks("c")
    install = re.search(r"\n```\n(cmake -S /path/to/deepx_flow/sdks/cpp.*?)```", DOC.read_text(),
                        re.S).group(1)
    (tmp_path / "quickstart.cpp").write_text(code)
    (tmp_path / "quickstart.c").write_text(c_code)
    # the install lines as written, with this checkout for /path/to/deepx_flow and a HOME
    # of the test's own
    env = {**os.environ, "HOME": str(tmp_path), "DEEPX_URL": served.url}
    for line in install.strip().splitlines():
        done = subprocess.run(["bash", "-c", line.replace("/path/to/deepx_flow", str(ROOT))],
                              cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, (line, done.stdout[-3000:], done.stderr[-3000:])
    for program, source, printing in (("quickstart", code, r"std::cout"),
                                      ("quickstart_c", c_code, r"printf")):
        done = subprocess.run([str(tmp_path / program)], cwd=tmp_path, capture_output=True,
                              text=True, timeout=240, env=env)
        assert done.returncode == 0, done.stderr
        # what the comments say each printing line prints
        said = re.findall(rf"{printing}.*?; +// (.*)", source)
        assert done.stdout.splitlines() == said, (done.stdout, said)
