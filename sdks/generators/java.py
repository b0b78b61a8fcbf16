"""Java: sdks/java/src/main/java/dev/deepx/flow/ OperatorTable.java (the table, as the SDK
checks graphs with it), GraphOperators.java (a method of Graph per operator, which Graph
extends) and Contract.java (the protocol and the table's hash, which Client.checkServer
compares with the gateway's)."""

from __future__ import annotations

import json

from deepx_flow.ops.table import operator_table
from generators.common import HEADER, parameters, protocol_version, table_hash

PACKAGE = "java/src/main/java/dev/deepx/flow/"
# Java's reserved words that ops/table.py's KEYWORDS lacks, and the options parameter's name:
# an input so named gets a trailing underscore as its parameter's name
JAVA_ONLY = {"abstract", "assert", "native", "strictfp", "synchronized", "throws", "transient",
             "volatile", "options"}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _doc(text: str) -> str:
    return text.replace("*/", "* /").replace("<", "&lt;").replace(">", "&gt;").replace("@", "{@literal @}")


def _attrs(items) -> str:
    return "List.of(" + ", ".join(
        f"new Attr({json.dumps(a.name)}, {json.dumps(a.type)}, {str(a.required).lower()})"
        for a in items) + ")"


def _table(ops) -> str:
    out = [HEADER, "package dev.deepx.flow;\n\n", "import java.util.List;\nimport java.util.Map;\n\n",
           "/** The operator table, as the SDK checks graphs with it. */\n",
           "final class OperatorTable {\n  private OperatorTable() {}\n\n",
           "  /** One attribute (or stated field): its name, type, and whether it is required. */\n",
           "  record Attr(String name, String type, boolean required) {}\n\n",
           "  /** One operator: its kind (primitive, composite), inputs (`name?` optional, "
           "`name...` variadic), attributes and stated fields. */\n",
           "  record Operator(String name, String kind, List<String> inputs, List<Attr> attrs, "
           "List<Attr> states) {}\n\n",
           "  static final Map<String, Operator> OPERATORS = Map.ofEntries(\n"]
    entries = [f"      Map.entry({json.dumps(op.name)}, new Operator({json.dumps(op.name)}, "
               f"{json.dumps(op.kind)}, List.of({', '.join(json.dumps(i) for i in op.inputs)}),\n"
               f"          {_attrs(op.attrs)},\n          {_attrs(op.states)}))" for op in ops]
    out.append(",\n".join(entries))
    out.append(");\n}\n")
    return "".join(out)


def _methods(op) -> list[str]:
    """The overloads of one operator's method: each number of operands it takes (optional
    inputs may be left out at the end), with and without options."""
    names = [n + "_" if n in JAVA_ONLY else n for n in parameters(op)]
    method = _camel(op.name)
    doc = f"  /** {_doc(op.doc)} ({op.kind} {op.name}, since {op.since}). */\n"
    out = []
    if op.variadic:
        out.append(f"{doc}  public Tensor {method}(List<?> {names[0]}, Map<String, ?> options) {{\n"
                   f"    return op({json.dumps(op.name)}, {names[0]}, options);\n  }}\n")
        out.append(f"{doc}  public Tensor {method}(List<?> {names[0]}) {{\n"
                   f"    return op({json.dumps(op.name)}, {names[0]}, null);\n  }}\n")
        return out
    required = len(op.inputs) - len(op.optional_inputs())
    for n in range(len(names), required - 1, -1):
        params = "".join(f"Object {p}, " for p in names[:n])
        operands = f"Arrays.asList({', '.join(names[:n])})" if n else "List.of()"
        out.append(f"{doc}  public Tensor {method}({params}Map<String, ?> options) {{\n"
                   f"    return op({json.dumps(op.name)}, {operands}, options);\n  }}\n")
        out.append(f"{doc}  public Tensor {method}({params[:-2]}) {{\n"
                   f"    return op({json.dumps(op.name)}, {operands}, null);\n  }}\n")
    return out


def files() -> dict[str, str]:
    """OperatorTable.java, GraphOperators.java and Contract.java of sdks/java."""
    table = operator_table()
    ops = [op for op in table.values() if op.name != "input"]  # (Graph.input is Graph's own)
    methods = [HEADER, "package dev.deepx.flow;\n\n",
               "import java.util.Arrays;\nimport java.util.List;\nimport java.util.Map;\n\n",
               "/**\n * A method of {@link Graph} for every operator of the table: operands are "
               "{@link Tensor}s of the graph\n * or Number and Boolean literals; options are the "
               "attributes, and \"id\", \"shape\" and \"dtype\".\n */\n",
               "public abstract class GraphOperators {\n",
               "  /** Any operator by name (Graph's). */\n",
               "  public abstract Tensor op(String name, List<?> inputs, Map<String, ?> options);\n"]
    for op in ops:
        methods.append("\n" + "\n".join(_methods(op)))
    methods.append("}\n")
    contract = (HEADER + "package dev.deepx.flow;\n\n"
                "/** What this SDK speaks: {@link Client#checkServer()} compares it with the "
                "gateway's capabilities. */\n"
                "public final class Contract {\n  private Contract() {}\n\n"
                "  /** The contract's protocol version. */\n"
                f"  public static final String PROTOCOL_VERSION = {json.dumps(protocol_version())};\n\n"
                "  /** The operator table's hash, as the gateway's capabilities give it. */\n"
                "  public static final String OPERATOR_TABLE_HASH =\n"
                f"      {json.dumps(table_hash())};\n}}\n")
    return {PACKAGE + "OperatorTable.java": _table(table.values()),
            PACKAGE + "GraphOperators.java": "".join(methods),
            PACKAGE + "Contract.java": contract}
