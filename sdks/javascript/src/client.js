// The gateway's contract over HTTP (docs/contract.md): analyze and run graphs, follow
// operations, call served models. Tensors travel as binary data both ways.

import { randomUUID } from "node:crypto";

import { DeepxError } from "./errors.js";
import { Graph } from "./graph.js";
import { toJson } from "./json.js";
import { OPERATORS, OPERATOR_TABLE_HASH, PROTOCOL_VERSION } from "./generated/table.js";
import { WIRE, fromRaw, rawBytes, tensor } from "./tensors.js";

const HEADER_LENGTH = "Inference-Header-Content-Length";
// How long one exchange waits for a run: a longer run is asked for again by its id (one the
// client chose), never left to a transport's timeout.
export const POLL_SECONDS = 60;
const KIND_OF_STATUS = { 400: "InputError", 401: "Unauthenticated", 404: "NotFound",
  405: "NotFound", 413: "TooLarge", 500: "ExecutionError" };

export class Client {
  /** A client of the gateway at `url` (deepx-flow serve's HTTP port); `token` for a gateway
   * that needs one (else DEEPX_GATEWAY_TOKEN where set). */
  constructor(url = "http://127.0.0.1:8000", { token = process.env.DEEPX_GATEWAY_TOKEN,
    pollSeconds = POLL_SECONDS } = {}) {
    this.url = url.replace(/\/+$/, "");
    this.token = token;
    this.pollSeconds = pollSeconds;
  }

  /** What the gateway speaks: protocol version, operator table and its hash, limits. */
  async capabilities() {
    return this._json("GET", "/v1/capabilities");
  }

  /** The capabilities, once the gateway is found to speak this SDK's protocol and operator
   * table (a DeepxError of kind RemoteError saying what differs, otherwise). */
  async checkServer() {
    return compatible(await this.capabilities(), this.url);
  }

  /** The gateway's analysis of `graph`: every node's shape and dtype, and the plan. */
  async analyze(graph) {
    return this._json("POST", "/v1/graphs:analyze", { graph: specOf(graph) });
  }

  /** Run `graph` on `inputs` (name -> tensor, see `tensor`) and wait for its outputs:
   * {state, operation, run_id, outputs: {name: {shape, dtype, data}}}. With `waitSeconds`,
   * answer once the run ends or that long passed (0: at once; follow with `operation`).
   * `operationId`: the caller's id for it (sent again, it attaches instead of running twice);
   * one is made otherwise. */
  async execute(graph, inputs = {}, { outputs, waitSeconds, operationId } = {}) {
    const body = { graph: specOf(graph), parameters: { binary_data_output: true },
      operation_id: operationId ?? newOperationId(), wait_seconds: waitSeconds ?? this.pollSeconds };
    if (outputs !== undefined) body.outputs = outputs;
    const answer = this._operation(await this._withTensors("/v1/graphs:execute", body, inputs));
    return waitSeconds === undefined ? ended(this, answer) : answer;
  }

  /** An operation (a graph's execution, an asset's materialization) as the gateway has it
   * now, or once it ends within `waitSeconds`: {operation, state, run_id, outputs, ...}. */
  async operation(id, { waitSeconds = 0 } = {}) {
    const query = `?binary_data_output=true${waitSeconds ? `&wait_seconds=${waitSeconds}` : ""}`;
    return this._operation(await this._call("GET", `/v1/operations/${encodeURIComponent(id)}${query}`));
  }

  /** Stop a running operation; the operation once it ended. */
  async cancel(id) {
    return this._operation(await this._call("POST", `/v1/operations/${encodeURIComponent(id)}:cancel`));
  }

  /** The runs the gateway's database records, newest first (`status`: running,
   * succeeded, failed, interrupted). */
  async runs({ status, limit } = {}) {
    const query = new URLSearchParams();
    if (status !== undefined) query.set("status", status);
    if (limit !== undefined) query.set("limit", String(limit));
    const text = query.toString();
    return (await this._json("GET", `/v1/runs${text ? "?" + text : ""}`)).runs;
  }

  /** One run by id: its status, tasks, workers, times, error. */
  async run(id) {
    return this._json("GET", `/v1/runs/${encodeURIComponent(id)}`);
  }

  /** Define (or define again) asset `name` computed by `graph` (one output; each input
   * reads the upstream asset of its name). Options: dependencies, description, partitions,
   * partitionAxis, checks (as docs/contract.md lists them). */
  async defineAsset(name, graph, { dependencies, description, partitions, partitionAxis, checks } = {}) {
    const body = { name, graph: specOf(graph) };
    if (dependencies !== undefined) body.dependencies = dependencies;
    if (description !== undefined) body.description = description;
    if (partitions !== undefined) body.partitions = partitions;
    if (partitionAxis !== undefined) body.partition_axis = partitionAxis;
    if (checks !== undefined) body.checks = checks;
    return this._json("POST", "/v1/assets:define", body);
  }

  /** Every asset defined: name, status, latest version, checks, ... */
  async assets() {
    return (await this._json("GET", "/v1/assets")).assets;
  }

  /** The stored versions of asset `name`, newest first. */
  async assetVersions(name) {
    return (await this._json("GET", `/v1/assets/${encodeURIComponent(name)}/versions`)).versions;
  }

  /** Make a new version of asset `name` (what is stale, or all with `force`): the operation,
   * whose `materialized` says what was made and checked. */
  async materialize(name, { partitions, force, upstream, waitSeconds, operationId } = {}) {
    const body = { operation_id: operationId ?? newOperationId(),
      wait_seconds: waitSeconds ?? this.pollSeconds };
    if (partitions !== undefined) body.partitions = partitions;
    if (force !== undefined) body.force = force;
    if (upstream !== undefined) body.upstream = upstream;
    const answer = await this._json("POST", `/v1/assets/${encodeURIComponent(name)}:materialize`, body);
    return waitSeconds === undefined ? ended(this, answer) : answer;
  }


  /** The newest usable version of asset `name` (or `version`, `partition`; `slice`: [start,
   * stop) per leading axis) as a tensor {shape, dtype, data}. */
  async readAsset(name, { version, partition, slice } = {}) {
    const body = { parameters: { binary_data_output: true } };
    if (version !== undefined) body.version = version;
    if (partition !== undefined) body.partition = partition;
    if (slice !== undefined) body.slice = slice;
    const answer = this._operation(await this._call("POST", `/v1/assets/${encodeURIComponent(name)}:read`,
      new TextEncoder().encode(toJson(body))));
    return answer.outputs[name];
  }

  /** Call served model `model` (the Open Inference Protocol's infer) on `inputs`. */
  async infer(model, inputs, { version } = {}) {
    const path = `/v2/models/${encodeURIComponent(model)}` +
      (version ? `/versions/${encodeURIComponent(version)}` : "") + "/infer";
    const answer = await this._withTensors(path, { parameters: { binary_data_output: true } }, inputs);
    return this._operation(answer);
  }

  async _withTensors(path, body, inputs) {
    const parts = [];
    body.inputs = Object.entries(inputs).map(([name, given]) => {
      const t = given?.data !== undefined && given?.shape !== undefined ? tensor(given.data, given.shape, given.dtype)
        : tensor(given);
      const raw = rawBytes(t);
      parts.push(raw);
      return { name, datatype: WIRE[t.dtype][0], shape: t.shape, parameters: { binary_data_size: raw.length } };
    });
    const head = new TextEncoder().encode(toJson(body));
    const data = new Uint8Array(head.length + parts.reduce((n, p) => n + p.length, 0));
    data.set(head, 0);
    let at = head.length;
    for (const p of parts) { data.set(p, at); at += p.length; }
    return this._call("POST", path, data, head.length);
  }

  async _json(method, path, body) {
    const [bytes] = await this._call(method, path,
      body === undefined ? undefined : new TextEncoder().encode(toJson(body)));
    return JSON.parse(new TextDecoder().decode(bytes));
  }

  async _call(method, path, body, headerLength) {
    const headers = { "Content-Type": headerLength === undefined ? "application/json" : "application/octet-stream" };
    if (headerLength !== undefined) headers[HEADER_LENGTH] = String(headerLength);
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    let answer;
    try {
      answer = await fetch(this.url + path, { method, headers, body });
    } catch (err) {
      throw new DeepxError(`cannot reach the gateway at ${this.url}: ${err.cause?.message ?? err.message}`,
        { kind: "RemoteError" });
    }
    const bytes = new Uint8Array(await answer.arrayBuffer());
    if (!answer.ok) {
      let message = new TextDecoder().decode(bytes);
      let kind = KIND_OF_STATUS[answer.status] ?? "RemoteError";
      try {
        const said = JSON.parse(message);
        message = said.error ?? message;
        kind = said.kind ?? kind;
      } catch { /* (not JSON: said as it came) */ }
      throw new DeepxError(message, { kind, status: answer.status });
    }
    const length = answer.headers.get(HEADER_LENGTH);
    return [bytes, length === null ? undefined : Number(length)];
  }

  _operation([bytes, length]) {
    const head = JSON.parse(new TextDecoder().decode(length === undefined ? bytes : bytes.subarray(0, length)));
    if (Array.isArray(head.outputs)) {
      const outputs = {};
      let at = length ?? bytes.length;
      for (const entry of head.outputs) {
        const size = entry.parameters?.binary_data_size;
        if (size === undefined) {
          outputs[entry.name] = tensor(entry.data, entry.shape, fromDatatype(entry.datatype));
          continue;
        }
        outputs[entry.name] = fromRaw(entry, bytes.subarray(at, at + size));
        at += size;
      }
      if (at !== bytes.length) { // (bytes the outputs do not account for: not guessed at)
        throw new DeepxError(`the gateway sent ${bytes.length - (length ?? bytes.length)} bytes of ` +
          `binary data for outputs of ${at - (length ?? bytes.length)}`, { kind: "RemoteError" });
      }
      head.outputs = outputs;
    }
    return head;
  }
}

function fromDatatype(datatype) {
  return Object.entries(WIRE).find(([, [w]]) => w === datatype)?.[0];
}

/** `answer` (an operation) once it is not running: asked for again by `client` (Client or
 * GrpcClient), `client.pollSeconds` at a time. */
export async function ended(client, answer) {
  while (answer.state === "running") {
    answer = await client.operation(answer.operation, { waitSeconds: client.pollSeconds });
  }
  return answer;
}

/** A new operation id: 32 random hex digits. */
export function newOperationId() {
  return randomUUID().replaceAll("-", "");
}

function specOf(graph) {
  return graph instanceof Graph ? graph.toSpec() : graph;
}

/** `caps` (a gateway's capabilities) where they are this SDK's protocol and operator table;
 * a DeepxError naming what differs, as Python's `dx.connect` says it, otherwise. */
export function compatible(caps, where) {
  if (caps.protocol_version !== PROTOCOL_VERSION) {
    throw new DeepxError(`${where} speaks '${caps.protocol_version}', this SDK ${PROTOCOL_VERSION}`,
      { kind: "RemoteError" });
  }
  if (caps.operator_table_hash !== OPERATOR_TABLE_HASH) {
    const theirs = new Set(caps.operators.map((o) => o.name));
    const missing = Object.keys(OPERATORS).filter((n) => !theirs.has(n)).sort();
    const unknown = [...theirs].filter((n) => !(n in OPERATORS)).sort();
    throw new DeepxError(`${where} has another operator table than this SDK: missing ` +
      `${missing.join(", ") || "none"}; not in this SDK ${unknown.join(", ") || "none"} ` +
      "(upgrade one side)", { kind: "RemoteError" });
  }
  return caps;
}
