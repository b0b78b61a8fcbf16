// The gRPC client against a running gateway (DEEPX_GRPC, as the Python tests start one;
// skipped without): the same answers as over HTTP, tensors past the 4 MiB message limit
// streamed both ways, refusals as DeepxErrors with their kind.
import assert from "node:assert/strict";
import { test } from "node:test";

import { DeepxError, Graph, tensor } from "../src/index.js";

const address = process.env.DEEPX_GRPC;
const skip = address ? false : "DEEPX_GRPC names no gateway";
const { GrpcClient } = address ? await import("../src/grpc.js") : {};

test("a graph runs over gRPC and its outputs come back typed", { skip }, async () => {
  const client = new GrpcClient(address);
  try {
    const g = new Graph();
    const n = g.input("n", [2], "int64");
    g.output(g.add(n, 1), "next").output(g.cast(n, { dtype: "float64" }), "wide");
    const big = 2n ** 62n + 3n;
    const done = await client.execute(g, { n: tensor(new BigInt64Array([big, -big])) });
    assert.equal(done.state, "succeeded");
    assert.deepEqual(done.outputs.next.data, new BigInt64Array([big + 1n, -big + 1n]));
    assert.deepEqual(done.outputs.wide.shape, [2]);
    assert.equal(done.outputs.wide.dtype, "float64");
    assert.ok(done.dashboard.endsWith(`/run?id=${done.run_id}`));
    assert.equal((await client.run(done.run_id)).status, "succeeded");
  } finally {
    client.close();
  }
});

test("a tensor past the message limit is streamed both ways", { skip }, async () => {
  const client = new GrpcClient(address);
  try {
    const n = 1_500_000; // (6 MB of float32: over 4 MiB)
    const x = new Float32Array(n);
    for (let i = 0; i < n; i++) x[i] = (i % 977) - 400;
    const g = new Graph();
    g.output(g.neg(g.input("x", [n])), "y");
    const done = await client.execute(g, { x: tensor(x) });
    assert.equal(done.outputs.y.data.length, n);
    for (let i = 0; i < n; i += 9973) assert.equal(done.outputs.y.data[i], -x[i]);
    assert.equal(done.outputs.y.data[n - 1], -x[n - 1]);
  } finally {
    client.close();
  }
});

test("the gateway's refusals over gRPC are DeepxErrors with their kind", { skip }, async () => {
  const client = new GrpcClient(address);
  try {
    const g = new Graph();
    g.output(g.relu(g.input("x", [2])));
    await assert.rejects(client.execute(g, { x: tensor([1, 2, 3], [3]) }), (err) => {
      assert.ok(err instanceof DeepxError);
      assert.equal(err.kind, "InputError");
      assert.match(err.message, /'x'/);
      return true;
    });
    await assert.rejects(client.operation("no-such-operation"), (err) => err.kind === "NotFound");
    await assert.rejects(client.infer("no_such_model", { x: tensor([1]) }),
      (err) => err.kind === "NotFound" && /no_such_model/.test(err.message));
  } finally {
    client.close();
  }
});

test("an unreachable gateway is a RemoteError", { skip }, async () => {
  const client = new GrpcClient("127.0.0.1:1");
  try {
    await assert.rejects(client.runs(), (err) => err.kind === "RemoteError" && /cannot reach/.test(err.message));
  } finally {
    client.close();
  }
});
