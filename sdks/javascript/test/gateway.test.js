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

test("an operation is followed by id, and its run is listed", { skip }, async () => {
  const client = new Client(url);
  const g = new Graph();
  g.output(g.exp(g.input("x", [3])), "e");
  const started = await client.execute(g, { x: tensor([0, 1, 2]) }, { waitSeconds: 60 });
  const again = await client.operation(started.operation, { waitSeconds: 30 });
  assert.equal(again.state, "succeeded");
  assert.deepEqual(Array.from(again.outputs.e.data), Array.from(started.outputs.e.data));
  const [newest] = await client.runs({ limit: 1 });
  assert.equal(newest.id ?? newest.run_id, started.run_id);
  const run = await client.run(started.run_id);
  assert.equal(run.status, "succeeded");
  // (cancelling what has ended changes nothing: its final state)
  assert.equal((await client.cancel(started.operation)).state, "succeeded");
  await assert.rejects(client.operation("no-such-operation"), (err) => err.kind === "NotFound" && err.status === 404);
});

test("assets are defined from graphs, materialized, listed and read", { skip }, async () => {
  const client = new Client(url);
  const name = `js_readings_${process.pid}`;
  const g = new Graph();
  const n = g.arange({ shape: [8], dtype: "float64", start: 0, step: 0.5 });
  g.output(g.reshape(n, { shape: [4, 2] }), "r");
  await client.defineAsset(name, g, { description: "eight readings", checks: [{ kind: "all_finite" }] });
  const totals = new Graph();
  totals.output(totals.sum(totals.input(name, [4, 2], "float64"), { axes: [1] }), "t");
  await client.defineAsset(`${name}_totals`, totals);
  const made = await client.materialize(`${name}_totals`, { upstream: true, waitSeconds: 120 });
  assert.equal(made.state, "succeeded", JSON.stringify(made.error));
  const read = await client.readAsset(`${name}_totals`);
  assert.equal(read.dtype, "float64");
  assert.deepEqual(Array.from(read.data), [0.5, 2.5, 4.5, 6.5]);
  const slice = await client.readAsset(name, { slice: [[1, 3]] });
  assert.deepEqual(slice.shape, [2, 2]);
  assert.deepEqual(Array.from(slice.data), [1, 1.5, 2, 2.5]);
  const listed = (await client.assets()).find((a) => a.name === name);
  assert.equal(listed.status, "fresh");
  const [version] = await client.assetVersions(name);
  assert.equal(version.checks_passed, true);
  await assert.rejects(client.readAsset("no_such_asset"), (err) => err.kind === "NotFound");
});

test("a -0 literal reaches the gateway as -0.0: -0 + -0 is -0", { skip }, async () => {
  const g = new Graph();
  g.output(g.add(g.input("x", [2]), -0), "y");
  const done = await new Client(url).execute(g, { x: tensor(new Float32Array([-0, 1])) });
  assert.ok(Object.is(done.outputs.y.data[0], -0), String(done.outputs.y.data[0]));
});

test("a run longer than one exchange's wait is asked for again until it ends", { skip }, async () => {
  // (a poll of 1 ms: submitting the 20 matmuls of 512 x 512 alone takes longer)
  const client = new Client(url, { pollSeconds: 0.001 });
  const g = new Graph();
  let m = g.full({ shape: [512, 512], dtype: "float32", value: 1 / 512 });
  const a = m;
  for (let i = 0; i < 20; i++) m = g.matmul(m, a);
  g.output(g.sum(m), "total");
  let asked = 0; // (how often the client asked for the operation again)
  const operation = client.operation.bind(client);
  client.operation = (...args) => { asked++; return operation(...args); };
  const done = await client.execute(g, {}, { operationId: `slow-${Date.now()}` });
  assert.equal(done.state, "succeeded");
  assert.ok(asked >= 1, "the run outlasted one wait and was asked for again");
  assert.ok(Math.abs(done.outputs.total.data[0] - 512) < 1e-2, String(done.outputs.total.data[0]));
});

test("bytes the outputs do not account for are refused, not guessed at", async () => {
  const { fromRaw } = await import("../src/tensors.js");
  assert.throws(() => fromRaw({ name: "y", datatype: "FP32", shape: [1] }, new Uint8Array(6)),
    (err) => err.kind === "RemoteError" && /6 bytes for float32\[1\]/.test(err.message));
});
