// deepx_flow for JavaScript: build tensor graphs, run them on a deepx_flow gateway, call its
// served models. The operators are methods of Graph, generated from the operator table.

import "./generated/operators.js";

export { Client } from "./client.js";
export { DeepxError, closest } from "./errors.js";
export { DTYPES, Graph, Tensor } from "./graph.js";
export { OPERATORS, OPERATOR_TABLE_HASH, PROTOCOL_VERSION } from "./generated/table.js";
export { WIRE, tensor, toFloat32 } from "./tensors.js";
