// The conformance suite's runner for JavaScript (sdks/conformance/run.sh calls it): each
// case is built through the SDK's public API (its steps, by method name) and must give the
// stored graph spec; then it runs on the gateway at DEEPX_URL and must give the stored
// outputs. Prints each failure and one line: `javascript http: N passed, N failed`.
//
//   node conformance.mjs CASES_FOLDER
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";

import { Client, Graph, WIRE, tensor } from "./src/index.js";

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

function values({ dtype, shape, data, encoding }) {
  const Kind = WIRE[dtype][1];
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

const folder = process.argv[2];
const client = new Client(process.env.DEEPX_URL);
let passed = 0, failed = 0;
for (const file of readdirSync(folder).filter((f) => f.endsWith(".json")).sort()) {
  const c = JSON.parse(readFileSync(join(folder, file), "utf8"));
  try {
    if (c.error?.at === "build") {
      assert.throws(() => built(c), (err) => {
        assert.equal(err.kind, c.error.kind, "the kind");
        assert.equal(err.message, c.error.message, "the message");
        return true;
      }, "the mistake is refused as it is made");
      passed++;
      continue;
    }
    const g = built(c);
    assert.deepEqual(g.toSpec(), c.spec, "the graph the steps build");
    if (c.error?.at === "run") {
      const inputs = Object.fromEntries(Object.entries(c.inputs).map(([n, t]) => [n, values(t)]));
      await assert.rejects(client.execute(g, inputs), (err) => {
        assert.equal(err.kind, c.error.kind, "the kind");
        assert.ok(err.message.includes(c.error.contains), `the message: ${err.message}`);
        return true;
      });
      passed++;
      continue;
    }
    const inputs = Object.fromEntries(Object.entries(c.inputs).map(([n, t]) => [n, values(t)]));
    const done = await client.execute(g, inputs);
    assert.equal(done.state, "succeeded", JSON.stringify(done.error));
    for (const [name, want] of Object.entries(c.expected)) {
      close(done.outputs[name], values(want), c.rtol, c.atol, name);
    }
    passed++;
  } catch (err) {
    failed++;
    console.log(`FAILED ${c.name}: ${err.message.split("\n")[0]}`);
  }
}
console.log(`javascript http: ${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
