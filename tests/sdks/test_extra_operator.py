"""Adding an operator to the table and regenerating is the whole change an SDK needs: a
table with one more composite (DEEPX_EXTRA_OPERATORS, its Python function in a module of
the test's), generated into copies of the SDKs, gives every language a method for it that
runs on a gateway reading the same table, with NumPy's answer; the SDKs of this checkout
have no such method."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.gateway.test_serve import Served
from tests.helpers import GO_OFFLINE, toolchain

ROOT = Path(__file__).resolve().parents[2]
EXTRA = """version: 1
operators:
  - name: softsign
    kind: composite
    python: "extra_ops:softsign"
    inputs: [x]
    attrs:
      scale: {type: float, default: 1.0}
    states: {}
    dtype: float
    differentiable: true
    since: "0.2.0"
    doc: "scale * x / (1 + |x|)"
"""
MODULE = """import deepx_flow as dx


def softsign(x, scale=1.0):
    return scale * x / (1 + dx.abs(x))
"""
X = [-3.0, -0.5, 0.0, 2.0]


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory):
    """(a folder with the extra table, its module and regenerated copies of the SDKs, and
    a gateway started with that table)."""
    root = tmp_path_factory.mktemp("extra-operator")
    (root / "extra.yaml").write_text(EXTRA)
    (root / "extra_ops.py").write_text(MODULE)
    for runner in (ROOT / "sdks").glob("*/conformance.sh"):  # (every SDK's folder)
        shutil.copytree(runner.parent, root / "sdks" / runner.parent.name,
                        ignore=shutil.ignore_patterns("node_modules", "build", "target"))
    env = {**os.environ, "DEEPX_EXTRA_OPERATORS": str(root / "extra.yaml")}
    subprocess.run([sys.executable, str(ROOT / "sdks" / "generate.py"), "--out",
                    str(root / "sdks")], check=True, env=env, timeout=120)
    server = Served(root, env={"DEEPX_EXTRA_OPERATORS": str(root / "extra.yaml"),
                               "PYTHONPATH": os.pathsep.join([str(root), str(ROOT)])})
    yield root, server
    assert server.stop() == 0


@pytest.mark.timeout(300)
def test_this_checkouts_sdk_finds_the_gateways_table_is_another(regenerated):
    _, server = regenerated
    node = toolchain("node")
    script = f"""
import {{ Client }} from "{ROOT / 'sdks' / 'javascript' / 'src' / 'index.js'}";
try {{
  await new Client(process.env.DEEPX_URL).checkServer();
}} catch (err) {{
  console.log(err.kind, err.message);
}}
"""
    done = subprocess.run([node, "--input-type=module", "-e", script], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "DEEPX_URL": server.url})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"RemoteError {server.url} has another operator table than this SDK: missing none; "
        "not in this SDK softsign (upgrade one side)")


def _want(scale):
    x = np.array(X, np.float32)
    return scale * x / (1 + np.abs(x))


def test_this_checkouts_sdks_have_no_such_method():
    assert "softsign" not in (ROOT / "sdks" / "javascript" / "src" / "generated" /
                              "operators.js").read_text()
    assert "Softsign" not in (ROOT / "sdks" / "go" / "deepx" / "operators.go").read_text()


@pytest.mark.timeout(300)
def test_javascript_regenerated_has_it_and_the_gateway_runs_it(regenerated):
    root, server = regenerated
    node = toolchain("node")
    script = root / "sdks" / "javascript" / "softsign.mjs"
    script.write_text(f"""
import {{ Client, Graph, tensor }} from "./src/index.js";
const client = new Client(process.env.DEEPX_URL);
await client.checkServer();  // (the same table as the gateway's: no complaint)
const g = new Graph();
g.output(g.softsign(g.input("x", [4]), {{ scale: 2 }}), "y");
const done = await client.execute(g, {{ x: tensor({X}) }});
console.log(JSON.stringify(Array.from(done.outputs.y.data)));
""")
    done = subprocess.run([node, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DEEPX_URL": server.url})
    assert done.returncode == 0, done.stderr
    np.testing.assert_allclose(json.loads(done.stdout), _want(2.0), rtol=1e-6)


@pytest.mark.timeout(600)
def test_go_regenerated_has_it_and_the_gateway_runs_it(regenerated):
    root, server = regenerated
    go = toolchain("go")
    program = root / "softsign"
    program.mkdir(exist_ok=True)
    (program / "go.mod").write_text(
        "module softsign\n\ngo 1.19\n\nrequire github.com/deepx-flow/deepx-go v0.0.0\n"
        f"replace github.com/deepx-flow/deepx-go => {root / 'sdks' / 'go'}\n")
    (program / "main.go").write_text(f"""package main

import (
	"encoding/json"
	"fmt"
	"log"
	"os"

	"github.com/deepx-flow/deepx-go/deepx"
)

func main() {{
	if _, err := deepx.NewClient(os.Getenv("DEEPX_URL")).CheckServer(); err != nil {{
		log.Fatal(err) // (the same table as the gateway's: no complaint)
	}}
	g := deepx.NewGraph()
	g.Output(g.Softsign(g.Input("x", []int{{4}}, "float32"), deepx.Options{{"scale": 0.5}}), "y")
	done, err := deepx.NewClient(os.Getenv("DEEPX_URL")).Execute(g, map[string]deepx.Values{{
		"x": {{Shape: []int{{4}}, Dtype: "float32", Data: []float32{{{", ".join(map(str, X))}}}}},
	}})
	if err != nil {{
		log.Fatal(err)
	}}
	out, _ := json.Marshal(done.Outputs["y"].Data)
	fmt.Println(string(out))
}}
""")
    done = subprocess.run([go, "run", "."], cwd=program, capture_output=True, text=True,
                          timeout=500, env={**os.environ, "DEEPX_URL": server.url,
                                            **GO_OFFLINE})
    assert done.returncode == 0, done.stderr
    np.testing.assert_allclose(json.loads(done.stdout), _want(0.5), rtol=1e-6)
