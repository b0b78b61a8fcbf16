// Building a graph: a Graph holds its nodes in the order they were made, each Tensor is one
// of them. Operators are checked as they are applied (name, number of inputs, attributes),
// with Python's messages; shapes and dtypes are the gateway's to infer (`Client.analyze`).
// `toSpec()` gives the graph spec (docs/graph-spec.md) the gateway reads, in its canonical
// form: node ids are the names given, or `<op>_<n>` in the order the nodes were made;
// attributes are those the caller gave; literals stay numbers in `args`.

import { DeepxError, didYouMean, shown } from "./errors.js";
import { OPERATORS } from "./generated/table.js";

export const DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
  "uint64", "float16", "bfloat16", "float32", "float64"];

/** One node of a graph: an input, or an operator applied to tensors and numbers. */
export class Tensor {
  constructor(graph, id, op) {
    this.graph = graph;
    this.id = id;
    this.op = op;
  }

  toString() {
    return `<Tensor ${this.id} (${this.op})>`;
  }
}

export class Graph {
  constructor() {
    this.inputs = new Map(); // name -> {shape, dtype}
    this.nodes = []; // {id, op, args, attrs, shape?, dtype?}
    this.outputs = []; // [name, id]
    this._ids = new Set();
  }

  /** A named input of `shape` and `dtype` (see DTYPES). */
  input(name, shape, dtype = "float32") {
    checkName(name, "an input's name");
    checkShape(shape, name);
    if (!DTYPES.includes(dtype)) {
      throw new DeepxError(`unknown dtype ${shown(dtype)}${didYouMean(dtype, DTYPES)}`,
        { kind: "GraphError", node: name });
    }
    this._claim(name);
    this.inputs.set(name, { shape: [...shape], dtype });
    return new Tensor(this, name, "input");
  }

  /** Any operator by name: `inputs` are tensors of this graph or numbers, `attrs` its
   * attributes; `stated` the node's own shape and dtype where the operator states them.
   * Every operator of the table also has a method of its own (generated/operators.js). */
  op(name, inputs = [], attrs = {}, { shape, dtype, id } = {}) {
    const entry = OPERATORS[name];
    const nodeId = id ?? this._autoId(name);
    if (entry === undefined || name === "input") {
      const names = Object.keys(OPERATORS).filter((n) => n !== "input");
      throw new DeepxError(`unknown operator ${shown(name)}${didYouMean(name, names)} (see ` +
        "docs/graph-spec.md or `deepx-flow ops` for the list)", { kind: "GraphError", node: nodeId });
    }
    checkInputs(entry, inputs, nodeId);
    const given = checkAttrs(entry, attrs, nodeId);
    const node = { id: nodeId, op: name, args: inputs.map((t) => this._arg(t, nodeId)) };
    // (a node may state its shape or dtype: the gateway checks it against its rule)
    for (const [field, value] of [["shape", shape], ["dtype", dtype]]) {
      if (value === undefined || value === null) continue;
      if (field === "shape") checkShape(value, nodeId);
      else if (!DTYPES.includes(value)) {
        throw new DeepxError(`unknown dtype ${shown(value)}${didYouMean(String(value), DTYPES)}`,
          { kind: "GraphError", node: nodeId });
      }
      node[field] = field === "shape" ? [...value] : value;
    }
    for (const [field, state] of Object.entries(entry.states)) {
      if (state.required && node[field] === undefined) {
        throw new DeepxError(`${name} needs a declared ${field}`, { kind: "GraphError", node: nodeId });
      }
    }
    if (Object.keys(given).length) node.attrs = given;
    this._claim(nodeId);
    this.nodes.push(node);
    return new Tensor(this, nodeId, name);
  }

  /** Name `tensor` as an output of the graph (by default, its id). */
  output(tensor, name = tensor.id) {
    this._own(tensor, "an output");
    checkName(name, "an output's name");
    if (this.outputs.some(([n]) => n === name)) {
      throw new DeepxError(`output ${shown(name)} is named twice`, { kind: "GraphError" });
    }
    this.outputs.push([name, tensor.id]);
    return this;
  }

  /** The graph spec: {deepx: 1, inputs, nodes, outputs}, as JSON can write it. */
  toSpec() {
    if (!this.outputs.length) {
      throw new DeepxError("the graph has no outputs: name at least one (graph.output)",
        { kind: "GraphError" });
    }
    return {
      deepx: 1,
      inputs: Object.fromEntries(this.inputs),
      nodes: this.nodes.map((n) => ({ ...n, args: [...n.args] })),
      outputs: this.outputs.map(([name, id]) => (name === id ? id : { [name]: id })),
    };
  }

  _arg(value, nodeId) {
    if (value instanceof Tensor) {
      this._own(value, `an operand of ${shown(nodeId)}`);
      return value.id;
    }
    if (typeof value === "number" && Number.isFinite(value)) return value;
    if (typeof value === "boolean") return value;
    throw new DeepxError(`an operand is ${shown(typeof value === "object" ? String(value) : value)}, ` +
      "not a tensor of this graph or a finite number", { kind: "GraphError", node: nodeId });
  }

  _own(tensor, what) {
    if (!(tensor instanceof Tensor) || tensor.graph !== this) {
      throw new DeepxError(`${what} is not a tensor of this graph`, { kind: "GraphError" });
    }
  }

  _autoId(name) {
    // <op>_<n>, n the node's place; past an id taken by a name given, the next free n
    let n = this.nodes.length;
    while (this._ids.has(`${name}_${n}`)) n++;
    return `${name}_${n}`;
  }

  _claim(id) {
    if (this._ids.has(id)) {
      throw new DeepxError("this id is taken by another input or node", { kind: "GraphError", node: id });
    }
    this._ids.add(id);
  }
}

function checkName(name, what) {
  if (typeof name !== "string" || !name) {
    throw new DeepxError(`${what} must be a non-empty string, not ${shown(name)}`, { kind: "GraphError" });
  }
}

function checkShape(shape, nodeId) {
  if (!Array.isArray(shape) || !shape.every((d) => Number.isInteger(d) && d >= 0)) {
    throw new DeepxError(`shape must be a list of non-negative integers, got ${shown(JSON.stringify(shape))}`,
      { kind: "GraphError", node: nodeId });
  }
}

function checkInputs(entry, inputs, nodeId) {
  if (!Array.isArray(inputs)) {
    throw new DeepxError(`${entry.name}'s inputs must be a list`, { kind: "GraphError", node: nodeId });
  }
  const variadic = entry.inputs.some((i) => i.endsWith("..."));
  const required = entry.inputs.filter((i) => !i.endsWith("?")).length;
  if (variadic) {
    if (inputs.length < 1) {
      throw new DeepxError(`${entry.name} needs at least one input`, { kind: "GraphError", node: nodeId });
    }
  } else if (entry.kind === "composite" && required !== entry.inputs.length) {
    if (inputs.length < required || inputs.length > entry.inputs.length) {
      throw new DeepxError(`${entry.name} takes ${required} to ${entry.inputs.length} input(s) ` +
        `(${entry.inputs.join(", ")}), got ${inputs.length}`, { kind: "GraphError", node: nodeId });
    }
  } else if (inputs.length !== entry.inputs.length) {
    const listed = entry.kind === "composite" ? ` (${entry.inputs.join(", ")})` : "";
    throw new DeepxError(`${entry.name} takes ${entry.inputs.length} input(s)${listed}, got ` +
      `${inputs.length}`, { kind: "GraphError", node: nodeId });
  }
}

function checkAttrs(entry, attrs, nodeId) {
  const known = Object.keys(entry.attrs);
  const given = {};
  for (const [key, value] of Object.entries(attrs ?? {})) {
    if (!known.includes(key)) {
      const close = didYouMean(key, known).replace(" (did you mean", "; did you mean").replace(/\)$/, "");
      throw new DeepxError(`${entry.name} has no attribute ${shown(key)} (allowed: ` +
        `${known.join(", ") || "none"})${close}`, { kind: "GraphError", node: nodeId });
    }
    if (value !== undefined) given[key] = checkValue(value, key, nodeId);
  }
  for (const [key, attr] of Object.entries(entry.attrs)) {
    if (attr.required && (given[key] === undefined || given[key] === null)) {
      throw new DeepxError(`${entry.name} needs attribute ${shown(key)}`, { kind: "GraphError", node: nodeId });
    }
  }
  return given;
}

// An attribute's value as a spec holds it: null, a bool, a finite number, a string, or a list
// of them; anything else (NaN, the infinities, a BigInt, an object) would not cross as
// written (JSON writes NaN as null: the operator's default), so it is refused.
function checkValue(value, key, nodeId, depth = 0) {
  if (value === null || typeof value === "boolean" || typeof value === "string") return value;
  if (typeof value === "number" && Number.isFinite(value)) return value;
  if (Array.isArray(value) && depth < 32) {
    return value.map((v) => checkValue(v, key, nodeId, depth + 1));
  }
  throw new DeepxError(`attribute ${shown(key)} is ${typeof value === "bigint" ? `${value}n` : String(value)}, ` +
    "not a value a spec holds (a finite number, a string, a bool, null, or a list of them)",
    { kind: "GraphError", node: nodeId });
}
