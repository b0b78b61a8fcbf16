// The conformance suite's runner for JavaScript (sdks/conformance/run.sh calls it): each
// case is built through the SDK's public API (its steps, by method name) and must give the
// stored graph spec; then it runs on the gateway at DEEPX_URL and must give the stored
// outputs. Each scenario's calls are made in order (make_scenarios.py says what each must
// give). Over HTTP (DEEPX_URL), then gRPC (DEEPX_GRPC, where set): prints each failure and a
// line per transport: `javascript http: N passed, N failed`, `javascript grpc: ...`.
//
//   node conformance.mjs FOLDER...    (of cases and scenarios)
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";

import { Client, Graph, OPERATOR_TABLE_HASH, PROTOCOL_VERSION, WIRE, tensor } from "./src/index.js";

function built(c) {
  const g = new Graph();
  const tensors = {};
  for (const step of c.steps) {
    if ("input" in step) {
      tensors[step.input] = g.input(step.input, step.shape, step.dtype);
      continue;
    }
    const args = step.args.map((a) => (typeof a === "string" ? tensors[a] : a));
    const options = { ...step.attrs, id: step.id };
    if (step.shape !== undefined) options.shape = step.shape;
    if (step.dtype !== undefined) options.dtype = step.dtype;
    // (the operator's own method; the generic op for a name the table lacks)
    tensors[step.id] = typeof g[step.op] === "function" ? g[step.op](...args, options)
      : g.op(step.op, args, step.attrs, { id: step.id });
  }
  for (const [name, id] of c.outputs) g.output(tensors[id], name);
  return g;
}

function values({ dtype, shape, data, encoding, pattern }) {
  const Kind = WIRE[dtype][1];
  if (pattern) { // (value i is (i mod modulo) * scale)
    const made = new Kind(shape.reduce((n, d) => n * d, 1));
    for (let i = 0; i < made.length; i++) made[i] = (i % pattern.modulo) * pattern.scale;
    return tensor(made, shape, dtype);
  }
  if (encoding === "bits") return tensor(Uint16Array.from(data), shape, dtype); // (float16, bfloat16)
  const parsed = data.map((v) => (Kind === BigInt64Array || Kind === BigUint64Array ? BigInt(v)
    : v === "NaN" ? NaN : v === "Infinity" ? Infinity : v === "-Infinity" ? -Infinity
      : typeof v === "boolean" ? Number(v) : v));
  return tensor(Kind.from(parsed), shape, dtype);
}

function close(got, want, rtol, atol, name) {
  assert.equal(got.dtype, want.dtype, `${name}: dtype`);
  assert.deepEqual(got.shape, want.shape, `${name}: shape`);
  const a = Array.from(got.data), b = Array.from(want.data);
  assert.equal(a.length, b.length, `${name}: ${a.length} values, not ${b.length}`);
  if (rtol === 0 && atol === 0) { // exactly: -0 is not 0, and NaN is NaN
    for (let i = 0; i < b.length; i++) assert.ok(Object.is(a[i], b[i]), `${name}[${i}]: ${a[i]}, not ${b[i]}`);
    return;
  }
  for (let i = 0; i < b.length; i++) { // (bigints exactly; NaN matches NaN)
    const ok = Object.is(a[i], b[i]) || a[i] === b[i] ||
      (typeof b[i] === "number" && Math.abs(a[i] - b[i]) <= atol + rtol * Math.abs(b[i]));
    assert.ok(ok, `${name}[${i}]: ${a[i]}, not ${b[i]}`);
  }
}

function inputsOf(given) {
  return Object.fromEntries(Object.entries(given).map(([n, t]) => [n, values(t)]));
}

async function runCase(c) {
  if (c.error?.at === "build") {
    assert.throws(() => built(c), (err) => {
      assert.equal(err.kind, c.error.kind, "the kind");
      assert.equal(err.message, c.error.message, "the message");
      return true;
    }, "the mistake is refused as it is made");
    return;
  }
  const g = built(c);
  assert.deepEqual(g.toSpec(), c.spec, "the graph the steps build");
  if (c.error?.at === "run") {
    await assert.rejects(client.execute(g, inputsOf(c.inputs)), (err) => {
      assert.equal(err.kind, c.error.kind, "the kind");
      assert.ok(err.message.includes(c.error.contains), `the message: ${err.message}`);
      return true;
    });
    return;
  }
  const done = await client.execute(g, inputsOf(c.inputs));
  assert.equal(done.state, "succeeded", JSON.stringify(done.error));
  for (const [name, want] of Object.entries(c.expected)) {
    close(done.outputs[name], values(want), c.rtol, c.atol, name);
  }
}

function graphOf(call) {
  const g = built(call.graph);
  assert.deepEqual(g.toSpec(), call.graph.spec, "the graph the steps build");
  return g;
}

// Each call of a scenario, by its "do".
const CALLS = {
  async define_asset(call) {
    await client.defineAsset(call.asset, graphOf(call));
  },
  async materialize(call) {
    const done = await client.materialize(call.asset);
    assert.equal(done.state, call.state, `${call.asset}: ${done.error}`);
  },
  async read_asset(call) {
    close(await client.readAsset(call.asset), values(call.expected), call.rtol, call.atol, call.asset);
  },
  async list_assets(call) {
    const names = (await client.assets()).map((a) => a.name);
    for (const name of call.includes) assert.ok(names.includes(name), `${name} is not listed`);
  },
  async asset_versions(call) {
    const versions = await client.assetVersions(call.asset);
    assert.ok(versions.length >= call.at_least, `${versions.length} versions of ${call.asset}`);
  },
  async execute(call) {
    const g = graphOf(call);
    let done = await client.execute(g, inputsOf(call.inputs), call.follow ? { waitSeconds: 0 } : {});
    if (call.follow) {
      while (done.state === "running") done = await client.operation(done.operation, { waitSeconds: 1 });
      assert.equal(done.state, "succeeded", done.error);
      assert.ok(done.progress.tasks_total > 0 && done.progress.tasks_done === done.progress.tasks_total,
        `progress ${JSON.stringify(done.progress)}`);
      assert.ok(done.dashboard.endsWith(`/run?id=${done.run_id}`), `dashboard ${done.dashboard}`);
      assert.equal((await client.run(done.run_id)).status, "succeeded");
      const runs = await client.runs({ limit: 100 });
      assert.ok(runs.some((r) => r.id === done.run_id), "the run is listed");
    }
    assert.equal(done.state, "succeeded", done.error);
    for (const [name, want] of Object.entries(call.expected)) {
      close(done.outputs[name], values(want), call.rtol, call.atol, name);
    }
  },
  async infer(call) {
    if (call.error) {
      await assert.rejects(client.infer(call.model, inputsOf(call.inputs)), (err) => {
        assert.equal(err.kind, call.error.kind, "the kind");
        assert.ok(err.message.includes(call.error.contains), `the message: ${err.message}`);
        return true;
      });
      return;
    }
    const done = await client.infer(call.model, inputsOf(call.inputs));
    for (const [name, want] of Object.entries(call.expected)) {
      close(done.outputs[name], values(want), call.rtol, call.atol, name);
    }
  },
  async analyze(call) {
    const answer = await client.analyze(graphOf(call));
    const values = (list) => list.map(({ name, datatype, shape }) => ({ name, datatype, shape: shape.map(Number) }));
    assert.deepEqual(values(answer.inputs), call.analysis.inputs, "the inputs");
    assert.deepEqual(values(answer.outputs), call.analysis.outputs, "the outputs");
    assert.ok(typeof answer.plan === "string" && answer.plan.length > 0, "a plan");
    assert.ok(Number(answer.tasks) >= 1, `tasks ${answer.tasks}`);
  },
  async cancel_ended(call) {
    const done = await client.execute(graphOf(call), inputsOf(call.inputs));
    assert.equal(done.state, "succeeded", done.error);
    const cancelled = await client.cancel(done.operation);
    assert.equal(cancelled.state, "succeeded"); // (it had ended: nothing changes)
    assert.equal(cancelled.outputs, undefined, "a cancel answers no outputs");
    const again = await client.operation(done.operation);
    for (const [name, t] of Object.entries(done.outputs)) close(again.outputs[name], t, 0, 0, name);
  },
  async check_server(call) {
    assert.equal(PROTOCOL_VERSION, call.protocol_version);
    assert.equal(OPERATOR_TABLE_HASH, call.operator_table_hash);
    const caps = await client.checkServer();
    assert.equal(caps.operator_table_hash, call.operator_table_hash);
  },
  async cancel(call) {
    const started = await client.execute(graphOf(call), inputsOf(call.inputs), { waitSeconds: 0 });
    assert.equal(started.state, "running");
    const done = await client.cancel(started.operation);
    assert.equal(done.state, "interrupted");
    assert.ok(done.error.includes("cancelled"), `the error: ${done.error}`);
    assert.equal((await client.run(done.run_id)).status, "interrupted");
  },
};

async function runScenario(s) {
  for (const [i, call] of s.scenario.entries()) {
    try {
      await CALLS[call.do](call);
    } catch (err) {
      err.message = `call ${i + 1} (${call.do}): ${err.message}`;
      throw err;
    }
  }
}

// Every case and scenario over each transport: HTTP, and gRPC where DEEPX_GRPC says where
let client;
let failedAny = false;
const transports = [["http", () => new Client(process.env.DEEPX_URL)]];
if (process.env.DEEPX_GRPC) { // (its packages, from npm: loaded only here)
  const { GrpcClient } = await import("./src/grpc.js");
  transports.push(["grpc", () => new GrpcClient(process.env.DEEPX_GRPC)]);
}
for (const [transport, make] of transports) {
  client = make();
  const prefix = `javascript_${transport}_`; // (this runner's assets, on a gateway others use too)
  let passed = 0, failed = 0;
  for (const folder of process.argv.slice(2)) {
    for (const file of readdirSync(folder).filter((f) => f.endsWith(".json")).sort()) {
      const c = JSON.parse(readFileSync(join(folder, file), "utf8").replaceAll("{prefix}", prefix));
      try {
        await (c.scenario ? runScenario(c) : runCase(c));
        passed++;
      } catch (err) {
        failed++;
        console.log(`FAILED ${transport} ${c.name}: ${err.message.split("\n")[0]}`);
      }
    }
  }
  client.close?.();
  console.log(`javascript ${transport}: ${passed} passed, ${failed} failed`);
  failedAny ||= failed > 0;
}
process.exit(failedAny ? 1 : 0);
