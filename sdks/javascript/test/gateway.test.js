// Against a running gateway (DEEPX_URL, as the Python tests start one; skipped without):
// graphs built here run there, outputs come back exact in every dtype, and the gateway's
// refusals arrive as DeepxErrors with their kind and message.
import assert from "node:assert/strict";
import { test } from "node:test";

import { Client, DeepxError, Graph, tensor } from "../src/index.js";

const url = process.env.DEEPX_URL;
const skip = url ? false : "DEEPX_URL names no gateway";

test("a graph built here runs on the gateway and its outputs come back", { skip }, async () => {
  const g = new Graph();
  const x = g.input("x", [2, 3]);
  const y = g.leaky_relu(g.mul(x, 2), { alpha: 0.5 });
  g.output(g.sum(y, { axes: [1] }), "total").output(g.argmax(x, { axis: 1 }), "label");
  const xs = [1, -2, 3, -4, 5, -6];
  const done = await new Client(url).execute(g, { x: tensor(new Float32Array(xs), [2, 3]) });
  assert.equal(done.state, "succeeded");
  const act = xs.map((v) => (2 * v > 0 ? 2 * v : 0.5 * 2 * v));
  assert.deepEqual(done.outputs.total.shape, [2]);
  assert.equal(done.outputs.total.dtype, "float32");
  assert.deepEqual(Array.from(done.outputs.total.data), [act[0] + act[1] + act[2], act[3] + act[4] + act[5]]);
  assert.equal(done.outputs.label.dtype, "int64");
  assert.deepEqual(done.outputs.label.data, new BigInt64Array([2n, 1n]));
});

test("int64 beyond 2**53 crosses exactly both ways", { skip }, async () => {
  const g = new Graph();
  const n = g.input("n", [2], "int64");
  g.output(g.add(n, 1), "next");
  const big = 2n ** 62n + 3n;
  const done = await new Client(url).execute(g, { n: tensor(new BigInt64Array([big, -big])) });
  assert.deepEqual(done.outputs.next.data, new BigInt64Array([big + 1n, -big + 1n]));
});

test("the gateway's analysis gives every node's shape and dtype", { skip }, async () => {
  const g = new Graph();
  const x = g.input("x", [4, 5]);
  g.output(g.matmul(x, g.transpose(x)), "gram");
  const analysis = await new Client(url).analyze(g);
  assert.ok(JSON.stringify(analysis).includes("gram") || JSON.stringify(analysis).includes("matmul"));
});

test("the gateway's refusals are DeepxErrors with their kind and message", { skip }, async () => {
  const client = new Client(url);
  const spec = { deepx: 1, inputs: { x: { shape: [2], dtype: "float32" } },
    nodes: [{ id: "y", op: "add", args: ["x", "missing"] }], outputs: ["y"] };
  await assert.rejects(client.execute(spec, { x: tensor([1, 2]) }), (err) => {
    assert.ok(err instanceof DeepxError);
    assert.equal(err.status, 400);
    assert.equal(err.kind, "SpecError");
    assert.match(err.message, /missing input 'missing'/);
    return true;
  });
  const g = new Graph();
  g.output(g.relu(g.input("x", [2])));
  await assert.rejects(client.execute(g, { x: tensor([1, 2, 3], [3]) }), (err) => {
    assert.equal(err.status, 400);
    assert.equal(err.kind, "InputError");
    assert.match(err.message, /x/);
    return true;
  });
  await assert.rejects(new Client("http://127.0.0.1:9").execute(g, {}), (err) => {
    assert.equal(err.kind, "RemoteError");
    assert.match(err.message, /cannot reach the gateway at http:\/\/127.0.0.1:9/);
    return true;
  });
});
