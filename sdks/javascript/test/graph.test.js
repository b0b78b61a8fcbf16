// Building graphs: the spec each call writes, and each mistake refused with Python's words.
import assert from "node:assert/strict";
import { test } from "node:test";

import { DeepxError, Graph, OPERATORS, closest, tensor, toFloat32 } from "../src/index.js";

test("operators build the canonical spec: ids by op and order, given attributes, literals", () => {
  const g = new Graph();
  const x = g.input("x", [2, 3]);
  const y = g.relu(g.add(x, 1.5));
  const s = g.sum(y, { axes: [1], keepdims: true, id: "total" });
  const m = g.argmax(x, { axis: -1 });
  g.output(s).output(m, "label");
  assert.deepEqual(g.toSpec(), {
    deepx: 1,
    inputs: { x: { shape: [2, 3], dtype: "float32" } },
    nodes: [
      { id: "add_0", op: "add", args: ["x", 1.5] },
      { id: "relu_1", op: "relu", args: ["add_0"] },
      { id: "total", op: "sum", args: ["relu_1"], attrs: { axes: [1], keepdims: true } },
      { id: "argmax_3", op: "argmax", args: ["x"], attrs: { axis: -1 } },
    ],
    outputs: ["total", { label: "argmax_3" }],
  });
});

test("sources state their shape and dtype; optional inputs may be left out", () => {
  const g = new Graph();
  const f = g.full({ shape: [2], dtype: "float64", value: 2 });
  const x = g.input("x", [4, 5]);
  const n = g.layer_norm(x, { eps: 0.001 });
  g.output(f).output(n);
  assert.deepEqual(g.toSpec().nodes, [
    { id: "full_0", op: "full", args: [], shape: [2], dtype: "float64", attrs: { value: 2 } },
    { id: "layer_norm_1", op: "layer_norm", args: ["x"], attrs: { eps: 0.001 } },
  ]);
});

const refused = (build, kind, message) => assert.throws(build, (err) => {
  assert.ok(err instanceof DeepxError, String(err));
  assert.equal(err.kind, kind);
  assert.equal(err.message, message);
  return true;
});

test("mistakes are refused as they are made, with Python's messages", () => {
  const g = new Graph();
  const x = g.input("x", [2, 3]);
  refused(() => g.op("relux", [x]), "GraphError",
    "node 'relux_0': unknown operator 'relux' (did you mean 'relu'?) (see docs/graph-spec.md or `deepx-flow ops` for the list)");
  refused(() => g.add(x), "GraphError", "node 'add_0': add takes 2 input(s), got 1");
  refused(() => g.full({ shape: [1], dtype: "float32" }), "GraphError", "node 'full_0': full needs attribute 'value'");
  refused(() => g.full({ dtype: "float32", value: 1 }), "GraphError", "node 'full_0': full needs a declared shape");
  refused(() => g.leaky_relu(x, { alpha: Infinity }), "GraphError",
    "node 'leaky_relu_0': attribute 'alpha' is Infinity, not a value a spec holds (a finite number, a string, a bool, null, or a list of them)");
  refused(() => g.pad(x, { widths: [[1, 1], [0, 0]], value: NaN }), "GraphError",
    "node 'pad_0': attribute 'value' is NaN, not a value a spec holds (a finite number, a string, a bool, null, or a list of them)");
  refused(() => g.full({ shape: [1], dtype: "float32", value: 2n }), "GraphError",
    "node 'full_0': attribute 'value' is 2n, not a value a spec holds (a finite number, a string, a bool, null, or a list of them)");
  refused(() => g.sum(x, { axis: 1 }), "GraphError",
    "node 'sum_0': sum has no attribute 'axis' (allowed: axes, keepdims); did you mean 'axes'?");
  refused(() => g.one_hot(x, {}), "GraphError", "node 'one_hot_0': one_hot needs attribute 'classes'");
  refused(() => g.leaky_relu(x, x), "GraphError", "node 'leaky_relu_0': leaky_relu takes 1 input(s) (x), got 2");
  refused(() => g.relu(new Graph().input("y", [1])), "GraphError", "an operand of 'relu_0' is not a tensor of this graph");
  refused(() => g.input("x", [1]), "GraphError", "node 'x': this id is taken by another input or node");
  refused(() => g.input("z", [1], "float8"), "GraphError", "node 'z': unknown dtype 'float8' (did you mean 'float64'?)");
  refused(() => new Graph().toSpec(), "GraphError", "the graph has no outputs: name at least one (graph.output)");
});

test("closest spells as Python's difflib does", () => {
  assert.equal(closest("relux", ["relu", "gelu", "exp"]), "relu");
  assert.equal(closest("Sum", ["sum", "mean"]), "sum");
  assert.equal(closest("zzz", ["sum", "mean"]), undefined);
});

test("every operator of the table but input is a method of Graph", () => {
  for (const name of Object.keys(OPERATORS)) {
    if (name !== "input") assert.equal(typeof Graph.prototype[name], "function", name);
  }
});

test("a node may state its shape; ids made do not take a name given", () => {
  const g = new Graph();
  const x = g.input("x", [2, 3]);
  g.relu(x, { id: "relu_1" });
  const y = g.relu(x, { shape: [2, 3] }); // (the gateway checks it against relu's rule)
  assert.equal(y.id, "relu_2");
  g.output(y);
  assert.deepEqual(g.toSpec().nodes[1], { id: "relu_2", op: "relu", args: ["x"], shape: [2, 3] });
});

test("tensors hold what their dtype holds exactly, or are refused", () => {
  assert.throws(() => tensor([1, 2], [2], "float16"), /float16 values are given as a Uint16Array of their 16-bit patterns/);
  assert.throws(() => tensor(new Float32Array([3]), [1], "bfloat16"), /bfloat16 values are given as a Uint16Array/);
  assert.deepEqual(tensor(new Uint16Array([0x3c00]), [1], "float16").data, new Uint16Array([0x3c00]));
  assert.throws(() => tensor([1, 2], [-1, -2]), /a shape is a list of non-negative integers/);
  assert.deepEqual(tensor([1, 2, 3], [3], "int64").data, new BigInt64Array([1n, 2n, 3n]));
  assert.equal(tensor(new Float64Array([1, 2])).dtype, "float64");
  assert.throws(() => tensor([1.5], [1], "int32"), /1.5 is not a int32 value/);
  assert.throws(() => tensor([2 ** 53 + 2], [1], "int64"), /is not a int64 value/);
  assert.throws(() => tensor([1e39], [1], "float32"), /beyond float32's range/);
  assert.throws(() => tensor([1, 2], [3]), /2 values, but shape \[3\] holds 3/);
  assert.deepEqual(Array.from(toFloat32({ dtype: "float16", data: new Uint16Array([0x3c00, 0xc000, 0x7c00]) })),
    [1, -2, Infinity]);
  assert.deepEqual(Array.from(toFloat32({ dtype: "bfloat16", data: new Uint16Array([0x3f80, 0x4049]) })),
    [1, 3.140625]);
});

test("a -0 literal travels as -0.0, not as 0", async () => {
  const { toJson } = await import("../src/json.js");
  const g = new Graph();
  g.output(g.add(g.input("x", [1]), -0), "y");
  assert.match(toJson(g.toSpec()), /"args":\["x",-0\.0\]/);
  assert.equal(toJson({ a: [0, -0, "-0", 1.5] }), '{"a":[0,-0.0,"-0",1.5]}');
});
