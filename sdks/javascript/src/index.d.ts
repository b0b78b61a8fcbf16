// Types of deepx_flow's JavaScript SDK. The operator methods of Graph are declared in
// generated/operators.d.ts, from the operator table.

import type { GraphOperators } from "./generated/operators.js";

export type Dtype = "bool" | "int8" | "int16" | "int32" | "int64" | "uint8" | "uint16" |
  "uint32" | "uint64" | "float16" | "bfloat16" | "float32" | "float64";

/** An operand: a tensor of the same graph, or a number (a literal in the spec). */
export type Operand = Tensor | number | boolean;

export type TypedData = Uint8Array | Int8Array | Int16Array | Int32Array | BigInt64Array |
  Uint16Array | Uint32Array | BigUint64Array | Float32Array | Float64Array;

/** Values with their shape and dtype. */
export interface Values {
  shape: number[];
  dtype: Dtype;
  data: TypedData;
}

export declare class DeepxError extends Error {
  constructor(message: string, options?: { kind?: string; status?: number; node?: string });
  kind: string;
  status?: number;
  node?: string;
}

export declare class Tensor {
  readonly graph: Graph;
  readonly id: string;
  readonly op: string;
}

export interface Graph extends GraphOperators {}
export declare class Graph {
  constructor();
  input(name: string, shape: number[], dtype?: Dtype): Tensor;
  op(name: string, inputs?: Operand[] | Tensor[], attrs?: Record<string, unknown>,
     options?: { shape?: number[]; dtype?: Dtype; id?: string }): Tensor;
  output(tensor: Tensor, name?: string): this;
  toSpec(): Record<string, unknown>;
}

export interface Operation {
  state: string;
  operation: string;
  run_id?: string;
  /** The run's page on the dashboard, once a run started. */
  dashboard?: string;
  /** How far the run has got, while it runs (and the whole count once it succeeded). */
  progress?: { tasks_done: number; tasks_total: number };
  error?: string;
  outputs?: Record<string, Values>;
  [field: string]: unknown;
}

export declare class Client {
  /** pollSeconds: how long one exchange waits for a run (60): a longer one is asked for again. */
  constructor(url?: string, options?: { token?: string; pollSeconds?: number });
  capabilities(): Promise<Record<string, unknown>>;
  checkServer(): Promise<Record<string, unknown>>;
  analyze(graph: Graph | object): Promise<Record<string, unknown>>;
  execute(graph: Graph | object, inputs?: Record<string, Values | TypedData | number[]>,
          options?: { outputs?: string[]; waitSeconds?: number; operationId?: string }): Promise<Operation>;
  operation(id: string, options?: { waitSeconds?: number }): Promise<Operation>;
  cancel(id: string): Promise<Operation>;
  runs(options?: { status?: string; limit?: number }): Promise<Record<string, unknown>[]>;
  run(id: string): Promise<Record<string, unknown>>;
  defineAsset(name: string, graph: Graph | object, options?: {
    dependencies?: string[]; description?: string; partitions?: string[];
    partitionAxis?: number; checks?: Record<string, unknown>[] }): Promise<Record<string, unknown>>;
  assets(): Promise<Record<string, unknown>[]>;
  assetVersions(name: string): Promise<Record<string, unknown>[]>;
  materialize(name: string, options?: { partitions?: string[]; force?: boolean;
    upstream?: boolean; waitSeconds?: number; operationId?: string }): Promise<Operation>;
  readAsset(name: string, options?: { version?: string; partition?: string;
    slice?: number[][] }): Promise<Values>;
  infer(model: string, inputs: Record<string, Values | TypedData | number[]>,
        options?: { version?: string }): Promise<Operation>;
}

export declare const DTYPES: Dtype[];
export declare const OPERATORS: Record<string, Record<string, unknown>>;
export declare const OPERATOR_TABLE_HASH: string;
export declare const PROTOCOL_VERSION: string;
export declare const WIRE: Record<Dtype, [string, unknown]>;
export declare function tensor(data: TypedData | ArrayLike<number | bigint | boolean>,
                               shape?: number[], dtype?: Dtype): Values;
export declare function toFloat32(values: Values): Float32Array;
export declare function closest(word: string, choices: Iterable<string>): string | undefined;
