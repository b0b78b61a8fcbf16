"""JavaScript: sdks/javascript/src/generated/ (the table, a method of Graph per operator,
their TypeScript declarations, and the contract's protos the gRPC client loads)."""

from __future__ import annotations

import json
from pathlib import Path

from deepx_flow.ops.table import operator_table
from generators.common import HEADER, parameters, protocol_version, table_entry, table_hash

TS_TYPES = {"bool": "boolean", "int": "number", "float": "number", "number": "number",
            "scalar": "number | boolean", "string": "string", "ints": "number[] | number",
            "int_pairs": "number[][]", "shape": "number[]", "dtype": "Dtype"}


def files() -> dict[str, str]:
    """sdks/javascript/src/generated/: the table, a method of Graph per operator, and their
    TypeScript declarations."""
    table = operator_table()
    ops = [op for op in table.values() if op.name != "input"]  # (graph.input is Graph's own)
    data = {op.name: table_entry(op) for op in table.values()}
    files = {"table.js": HEADER + "// The operator table, as the SDK checks graphs with it.\n"
             "export const OPERATORS = " + json.dumps(data, indent=1) + ";\n"
             "// The contract this SDK speaks, and its table's hash as the gateway's capabilities\n"
             "// give it: Client.checkServer compares them.\n"
             f"export const PROTOCOL_VERSION = {json.dumps(protocol_version())};\n"
             f"export const OPERATOR_TABLE_HASH = {json.dumps(table_hash())};\n"}
    methods = [HEADER, 'import { Graph, Tensor } from "../graph.js";\n\n',
               "// (the operands given, and the options object that may follow them)\n",
               "function split(args) {\n",
               "  const last = args[args.length - 1];\n",
               "  const isOptions = last !== null && typeof last === \"object\" &&\n",
               "    !(last instanceof Tensor) && !Array.isArray(last);\n",
               "  return isOptions ? [args.slice(0, -1), last] : [args, {}];\n",
               "}\n"]
    declarations = [HEADER, 'import type { Dtype, Operand, Tensor } from "../index.js";\n\n',
                    "/** A method of Graph for every operator of the table. */\n",
                    "export interface GraphOperators {\n"]
    for op in ops:
        inputs = parameters(op)
        doc = f"{op.doc} ({op.kind}, since {op.since})"
        inputs_expr = ("(given.length === 1 && Array.isArray(given[0]) ? given[0] : given)"
                       if op.variadic else "given")
        methods.append(
            f"\n/** {doc} */\n"
            f"Graph.prototype.{op.name} = function (...args) {{\n"
            f"  const [given, {{ shape, dtype, id, ...attrs }}] = split(args);\n"
            f"  return this.op({json.dumps(op.name)}, {inputs_expr}, attrs, "
            f"{{ shape, dtype, id }});\n}};\n")
        typed = []
        for n, raw in zip(inputs, op.inputs):
            if raw.endswith("..."):
                typed.append(f"{n}: Operand[]")
            else:
                typed.append(f"{n}{'?' if raw.endswith('?') else ''}: Operand")
        # (a primitive's ints are lists, one value per axis; a composite's function also
        # takes one int for all)
        types = TS_TYPES if op.kind == "composite" else {**TS_TYPES, "ints": "number[]"}
        fields = [f"{a.name}{'' if a.required else '?'}: {types[a.type]}"
                  + ("" if a.required else " | null") for a in op.attrs]
        fields += [f"{s.name}{'' if s.required else '?'}: {TS_TYPES[s.type]}"
                   for s in op.states]
        fields.append("id?: string")
        needed = any(a.required for a in op.attrs + op.states)
        typed.append(f"options{'' if needed else '?'}: {{ {'; '.join(fields)} }}")
        declarations.append(f"  /** {doc} */\n  {op.name}({', '.join(typed)}): Tensor;\n")
    declarations.append("}\n")
    files["operators.js"] = "".join(methods)
    files["operators.d.ts"] = "".join(declarations)
    files.update(protos())
    return {f"javascript/src/generated/{name}": text for name, text in files.items()}


PROTO = Path(__file__).resolve().parents[2] / "proto"
PROTOS = ["deepx/v1/tensor.proto", "deepx/v1/graphs.proto", "deepx/v1/catalog.proto",
          "inference/grpc_service.proto"]


def protos() -> dict[str, str]:
    """The contract's .proto files as the gRPC client loads them (the package holds its own
    copy). The Open Inference Protocol's keeps the protocol's package name, `inference`:
    proto/'s is `deepx.inference` only so that Python can hold it beside tritonclient's, and
    a client that loads the file names the service by its package."""
    out = {}
    for name in PROTOS:
        text = (PROTO / name).read_text()
        if name.startswith("inference/"):
            assert "\npackage deepx.inference;\n" in text
            text = text.replace("\npackage deepx.inference;\n", "\npackage inference;\n")
        out[f"proto/{name}"] = "// Copied by sdks/generate.py from proto/: do not edit.\n" + text
    return out
