// The gateway's contract over gRPC (docs/contract.md), with @grpc/grpc-js: the same calls and
// answers as Client over HTTP, so that either serves a program. Tensors travel as raw bytes;
// one past the message limit (4 MiB) is sent as a header marked `streamed` followed by
// chunks of at most 1 MiB, and comes back the same way. A served model is called over the
// Open Inference Protocol's gRPC service.
//
//   import { GrpcClient } from "deepx-flow/grpc";
//   const client = new GrpcClient("127.0.0.1:8001");

import { fileURLToPath } from "node:url";

import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";

import { POLL_SECONDS, compatible, ended, newOperationId } from "./client.js";
import { DeepxError } from "./errors.js";
import { Graph } from "./graph.js";
import { toJson } from "./json.js";
import { WIRE, fromRaw, rawBytes, tensor } from "./tensors.js";

const MESSAGE_BYTES = 4 << 20; // gRPC's usual limit on one message
const HEADER_SLACK = 64 << 10; // room for a message's fields beside its largest bytes
const CHUNK_BYTES = 1 << 20;
const KIND_KEY = "deepx-error-kind"; // (trailing metadata: the error's kind)
// the kind of an error that says none (the Open Inference Protocol's), by its status code
const KIND_OF_CODE = { [grpc.status.INVALID_ARGUMENT]: "InputError",
  [grpc.status.NOT_FOUND]: "NotFound", [grpc.status.UNAUTHENTICATED]: "Unauthenticated",
  [grpc.status.RESOURCE_EXHAUSTED]: "TooLarge", [grpc.status.INTERNAL]: "ExecutionError" };

const PROTO_DIR = fileURLToPath(new URL("./generated/proto/", import.meta.url));
let services; // (loaded once, on the first client)

function loaded() {
  if (services === undefined) {
    const definition = protoLoader.loadSync(
      ["deepx/v1/graphs.proto", "deepx/v1/catalog.proto", "inference/grpc_service.proto"],
      { includeDirs: [PROTO_DIR], keepCase: true, longs: Number, defaults: true, oneofs: true });
    const tree = grpc.loadPackageDefinition(definition);
    services = { graphs: tree.deepx.v1.GraphService, catalog: tree.deepx.v1.CatalogService,
      inference: tree.inference.GRPCInferenceService };
  }
  return services;
}

export class GrpcClient {
  /** A client of the gateway's gRPC port at `address` (host:port); `token` for a gateway
   * that needs one (else DEEPX_GATEWAY_TOKEN where set). Plain text: on loopback, or
   * `credentials` (grpc.credentials.createSsl()) for TLS. */
  constructor(address = "127.0.0.1:8001", { token = process.env.DEEPX_GATEWAY_TOKEN,
    credentials = grpc.credentials.createInsecure(), pollSeconds = POLL_SECONDS } = {}) {
    this.pollSeconds = pollSeconds;
    const { graphs, catalog, inference } = loaded();
    this.address = address;
    const options = { "grpc.max_receive_message_length": MESSAGE_BYTES + HEADER_SLACK };
    this.graphs = new graphs(address, credentials, options);
    this.catalog = new catalog(address, credentials, options);
    this.inference = new inference(address, credentials, options);
    this.metadata = new grpc.Metadata();
    if (token) this.metadata.set("authorization", `Bearer ${token}`);
  }

  /** Close the connections. */
  close() {
    for (const stub of [this.graphs, this.catalog, this.inference]) stub.close();
  }

  /** What the gateway speaks: protocol version, operator table and its hash, limits. */
  async capabilities() {
    return this._unary(this.graphs, "GetCapabilities", {});
  }

  /** The capabilities, once the gateway is found to speak this SDK's protocol and operator
   * table (a DeepxError of kind RemoteError saying what differs, otherwise). */
  async checkServer() {
    return compatible(await this.capabilities(), this.address);
  }

  /** The gateway's analysis of `graph`: every node's shape and dtype, and the plan. */
  async analyze(graph) {
    return this._unary(this.graphs, "AnalyzeGraph", { graph_json: specJson(graph) });
  }

  /** Run `graph` on `inputs` (name -> tensor) and wait for its outputs (or `waitSeconds`):
   * the operation, as Client.execute gives it. */
  async execute(graph, inputs = {}, { outputs, waitSeconds, operationId } = {}) {
    const header = { graph_json: specJson(graph), inputs: [],
      operation_id: operationId ?? newOperationId(), wait_seconds: waitSeconds ?? this.pollSeconds };
    if (outputs !== undefined) header.outputs = outputs.map((name) => ({ name }));
    const streamed = [];
    let room = MESSAGE_BYTES - HEADER_SLACK;
    for (const [name, given] of Object.entries(inputs)) {
      const t = given?.data !== undefined && given?.shape !== undefined
        ? tensor(given.data, given.shape, given.dtype) : tensor(given);
      const raw = rawBytes(t);
      const message = { name, datatype: WIRE[t.dtype][0], shape: t.shape };
      if (raw.length <= room) { // (inline while they fit together in one message)
        message.raw_contents = Buffer.from(raw.buffer, raw.byteOffset, raw.length);
        room -= raw.length;
      } else {
        message.streamed = true;
        streamed.push([header.inputs.length, raw]);
      }
      header.inputs.push(message);
    }
    const call = this.graphs.ExecuteGraph(this.metadata);
    const answered = this._operationOf(call);
    call.write({ header });
    for (const [index, raw] of streamed) {
      for (let offset = 0; offset < raw.length; offset += CHUNK_BYTES) {
        const data = raw.subarray(offset, offset + CHUNK_BYTES);
        call.write({ input_chunk: { tensor: index, offset,
          data: Buffer.from(data.buffer, data.byteOffset, data.length) } });
      }
    }
    call.end();
    return waitSeconds === undefined ? ended(this, await answered) : answered;
  }


  /** An operation as the gateway has it now, or once it ends within `waitSeconds`. */
  async operation(id, { waitSeconds = 0 } = {}) {
    return this._operationOf(this.graphs.GetOperation({ id, wait_seconds: waitSeconds }, this.metadata));
  }

  /** Stop a running operation; the operation once it ended. */
  async cancel(id) {
    return operationFields(await this._unary(this.graphs, "CancelOperation", { id }), undefined);
  }

  /** The runs the gateway's database records, newest first. */
  async runs({ status, limit } = {}) {
    return (await this._unary(this.catalog, "ListRuns", { status: status ?? "", limit: limit ?? 0 })).runs;
  }

  /** One run by id: its status, tasks, workers, times, error. */
  async run(id) {
    return this._unary(this.catalog, "GetRun", { id });
  }

  /** Define (or define again) asset `name` computed by `graph` (as Client.defineAsset). */
  async defineAsset(name, graph, { dependencies, description, partitions, partitionAxis, checks } = {}) {
    const request = { name, graph_json: specJson(graph), dependencies: dependencies ?? [],
      description: description ?? "", partitions: partitions ?? [], checks: checks ?? [] };
    if (partitionAxis !== undefined) request.partition_axis = partitionAxis;
    return this._unary(this.catalog, "DefineAsset", request);
  }

  /** Every asset defined: name, status, latest version, checks, ... */
  async assets() {
    return (await this._unary(this.catalog, "ListAssets", {})).assets;
  }

  /** The stored versions of asset `name`, newest first. */
  async assetVersions(name) {
    return (await this._unary(this.catalog, "ListAssetVersions", { name })).versions;
  }

  /** Make a new version of asset `name`: the operation, whose `materialized` says what was
   * made and checked. */
  async materialize(name, { partitions, force, upstream, waitSeconds, operationId } = {}) {
    const request = { name, partitions: partitions ?? [], force: force ?? false, upstream: upstream ?? false,
      operation_id: operationId ?? newOperationId(), wait_seconds: waitSeconds ?? this.pollSeconds };
    const answer = await this._operationOf(this.catalog.MaterializeAsset(request, this.metadata));
    return waitSeconds === undefined ? ended(this, answer) : answer;
  }

  /** The newest usable version of asset `name` (or `version`, `partition`; `slice`: [start,
   * stop) per leading axis) as a tensor {shape, dtype, data}. */
  async readAsset(name, { version, partition, slice } = {}) {
    const request = { asset: { name, version: version ?? "", partition: partition ?? "" },
      slice: (slice ?? []).map(([start, stop]) => ({ start, stop })) };
    const messages = await collected(this.catalog.ReadAsset(request, this.metadata), this.address);
    const [first, ...chunks] = messages;
    const header = first.tensor;
    return tensorOf(header, header.streamed ? joined(chunks.map((m) => m.chunk), 0) : header.raw_contents);
  }

  /** Call served model `model` (the Open Inference Protocol's ModelInfer) on `inputs`:
   * {model_name, model_version, outputs: {name: tensor}}. */
  async infer(model, inputs, { version } = {}) {
    const request = { model_name: model, model_version: version ?? "", inputs: [], raw_input_contents: [] };
    for (const [name, given] of Object.entries(inputs)) {
      const t = given?.data !== undefined && given?.shape !== undefined
        ? tensor(given.data, given.shape, given.dtype) : tensor(given);
      const raw = rawBytes(t);
      request.inputs.push({ name, datatype: WIRE[t.dtype][0], shape: t.shape });
      request.raw_input_contents.push(Buffer.from(raw.buffer, raw.byteOffset, raw.length));
    }
    const answer = await this._unary(this.inference, "ModelInfer", request);
    const outputs = {};
    answer.outputs.forEach((o, i) => { outputs[o.name] = tensorOf(o, answer.raw_output_contents[i]); });
    return { model_name: answer.model_name, model_version: answer.model_version, outputs };
  }

  _unary(stub, method, request) {
    return new Promise((resolve, reject) => {
      stub[method](request, this.metadata, (err, answer) => (err ? reject(errorOf(err, ` at ${this.address}`)) : resolve(answer)));
    });
  }

  async _operationOf(call) {
    const [first, ...rest] = await collected(call, this.address);
    const operation = first?.operation;
    if (operation === undefined) throw new DeepxError("the answer does not start with the operation", { kind: "RemoteError" });
    const outputs = {};
    operation.outputs.forEach((t, i) => {
      outputs[t.name] = tensorOf(t, t.streamed ? joined(rest.map((m) => m.output_chunk), i) : t.raw_contents);
    });
    return operationFields(operation, outputs);
  }
}

// An operation as Client (HTTP) gives it: the same field names (a cancel's: no outputs).
function operationFields(o, outputs) {
  const answer = { operation: o.id, state: o.state, kind: o.kind, run_id: o.run_id,
    created_at: o.created_at, ended_at: o.ended_at };
  if (o.error) answer.error = o.error;
  if (o.dashboard) answer.dashboard = o.dashboard;
  if (o.progress) answer.progress = { tasks_done: o.progress.tasks_done, tasks_total: o.progress.tasks_total };
  if (o.materialized) answer.materialized = o.materialized;
  else if (o.state === "succeeded" && outputs !== undefined) answer.outputs = outputs;
  return answer;
}

function collected(call, where) {
  return new Promise((resolve, reject) => {
    const messages = [];
    call.on("data", (m) => messages.push(m));
    call.on("error", (err) => reject(errorOf(err, ` at ${where}`)));
    call.on("end", () => resolve(messages));
  });
}

// The bytes of streamed tensor `index`, from its chunks in order.
function joined(chunks, index) {
  const mine = chunks.filter((c) => c.tensor === index);
  let at = 0;
  for (const c of mine) {
    if (Number(c.offset) !== at) throw new DeepxError(`tensor ${index}: a chunk at ${c.offset}, not ${at}`, { kind: "RemoteError" });
    at += c.data.length;
  }
  return Buffer.concat(mine.map((c) => c.data));
}

function tensorOf(message, raw) {
  return fromRaw({ name: message.name, datatype: message.datatype, shape: message.shape.map(Number) },
    new Uint8Array(raw.buffer, raw.byteOffset, raw.length));
}

function errorOf(err, where = "") {
  const said = err.metadata?.get(KIND_KEY)?.[0];
  const kind = said === undefined ? KIND_OF_CODE[err.code] ?? "RemoteError" : String(said);
  const message = err.code === grpc.status.UNAVAILABLE ? `cannot reach the gateway${where}: ${err.details}`
    : err.details;
  const error = new DeepxError(message, { kind });
  error.code = err.code;
  return error;
}

function specJson(graph) {
  return toJson(graph instanceof Graph ? graph.toSpec() : graph);
}
