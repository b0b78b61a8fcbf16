"""Across languages on one gateway: a graph built in Go is defined and materialized as an
asset, which JavaScript reads (NumPy's values); the model trained and packaged in Python
(tests/sdks/trained_model.py) gives Python's answer when JavaScript and Go call it (the
other SDKs' tests call it from C, C++, Java and Lua)."""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import GO_OFFLINE, toolchain
from tests.sdks.trained_model import trained  # noqa: F401  (the served model)

ROOT = Path(__file__).resolve().parents[2]


def _go(program: str, folder: Path, env: dict) -> str:
    """Run a Go program using the SDK of this checkout; its standard output."""
    go = toolchain("go")
    folder.mkdir()
    (folder / "go.mod").write_text(
        "module crosslanguage\n\ngo 1.19\n\nrequire github.com/deepx-flow/deepx-go v0.0.0\n"
        f"replace github.com/deepx-flow/deepx-go => {ROOT / 'sdks' / 'go'}\n")
    (folder / "main.go").write_text(program)
    done = subprocess.run([go, "run", "."], cwd=folder, capture_output=True, text=True,
                          timeout=500, env={**os.environ, **env, **GO_OFFLINE})
    assert done.returncode == 0, done.stderr
    return done.stdout


def _node(script: str, folder: Path, env: dict) -> str:
    node = toolchain("node")
    (folder / "node_modules").mkdir(parents=True)
    (folder / "node_modules" / "deepx-flow").symlink_to(ROOT / "sdks" / "javascript")
    (folder / "main.mjs").write_text(script)
    done = subprocess.run([node, "main.mjs"], cwd=folder, capture_output=True, text=True,
                          timeout=240, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    return done.stdout


GO_DEFINES = """package main

import (
	"fmt"
	"log"
	"os"

	"github.com/deepx-flow/deepx-go/deepx"
)

func main() {
	client := deepx.NewClient(os.Getenv("DEEPX_URL"))
	g := deepx.NewGraph()
	line := g.Arange(deepx.Options{"shape": []int{6}, "dtype": "float64", "start": -1, "step": 0.5})
	n := g.Reshape(line, deepx.Options{"shape": []int{2, 3}})
	g.Output(g.Tanh(g.Mul(n, n)), "curve")
	if _, err := client.DefineAsset("made_in_go", g, map[string]any{"description": "from Go"}); err != nil {
		log.Fatal(err)
	}
	made, err := client.Materialize("made_in_go", nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(made.State)
}
"""

JS_READS = """import { Client } from "deepx-flow";
const client = new Client(process.env.DEEPX_URL);
const read = await client.readAsset("made_in_go");
const [asset] = (await client.assets()).filter((a) => a.name === "made_in_go");
console.log(JSON.stringify({ shape: read.shape, dtype: read.dtype, data: Array.from(read.data),
  description: asset.description }));
"""


@pytest.mark.timeout(900)
def test_an_asset_defined_in_go_is_read_in_javascript(trained, tmp_path):  # noqa: F811
    env = {"DEEPX_URL": trained.url}
    assert _go(GO_DEFINES, tmp_path / "go", env).split() == ["succeeded"]
    read = json.loads(_node(JS_READS, tmp_path / "js", env))
    n = -1 + 0.5 * np.arange(6, dtype=np.float64).reshape(2, 3)
    assert (read["shape"], read["dtype"], read["description"]) == ([2, 3], "float64", "from Go")
    np.testing.assert_allclose(read["data"], np.tanh(n * n).ravel(), rtol=1e-15, atol=0)


@pytest.mark.timeout(900)
def test_the_model_trained_in_python_answers_javascript_and_go_as_python(trained, tmp_path):  # noqa: F811,E501
    rows = trained.x.ravel().tolist()
    script = f"""import {{ Client, tensor }} from "deepx-flow";
const answer = await new Client(process.env.DEEPX_URL).infer("{trained.model}",
  {{ "{trained.input}": tensor(new Float32Array({rows}), {list(trained.x.shape)}) }});
console.log(JSON.stringify(Array.from(answer.outputs["{trained.output}"].data)));
"""
    got = json.loads(_node(script, tmp_path / "js", {"DEEPX_URL": trained.url}))
    np.testing.assert_allclose(np.reshape(got, trained.want.shape), trained.want, rtol=1e-6)
    program = f"""package main

import (
	"encoding/json"
	"fmt"
	"log"
	"os"

	"github.com/deepx-flow/deepx-go/deepx"
)

func main() {{
	answer, err := deepx.NewClient(os.Getenv("DEEPX_URL")).Infer("{trained.model}", map[string]deepx.Values{{
		"{trained.input}": {{Shape: []int{{{", ".join(map(str, trained.x.shape))}}}, Dtype: "float32",
			Data: []float32{{{", ".join(repr(float(v)) for v in trained.x.ravel())}}}}},
	}})
	if err != nil {{
		log.Fatal(err)
	}}
	out, _ := json.Marshal(answer.Outputs["{trained.output}"].Data)
	fmt.Println(string(out))
}}
"""
    got = json.loads(_go(program, tmp_path / "go", {"DEEPX_URL": trained.url}))
    np.testing.assert_allclose(np.reshape(got, trained.want.shape), trained.want, rtol=1e-6)
