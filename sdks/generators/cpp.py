"""C/C++: sdks/cpp/ (the table the library checks graphs with, a method of Graph per operator,
and the conformance runner's table of those methods by operator name)."""

from __future__ import annotations

import json

from deepx_flow.ops.table import operator_table
from generators.common import HEADER, parameters, protocol_version, table_hash

# C++'s keywords and alternative tokens that the table's names could be (ops/table.py holds
# input names to its KEYWORDS, which has most but not these): such a name gets a trailing _
CPP_KEYWORDS = {"and", "and_eq", "asm", "auto", "bitand", "bitor", "bool", "compl", "concept",
                "const_cast", "constexpr", "consteval", "constinit", "co_await", "co_return",
                "co_yield", "decltype", "dynamic_cast", "explicit", "extern", "friend",
                "inline", "mutable", "namespace", "noexcept", "not", "not_eq", "nullptr",
                "operator", "or", "or_eq", "register", "reinterpret_cast", "requires",
                "signed", "sizeof", "static_assert", "static_cast", "template",
                "thread_local", "typedef", "typeid", "typename", "union", "unsigned", "using",
                "virtual", "volatile", "wchar_t", "xor", "xor_eq", "options"}


def method_name(name: str) -> str:
    """The Graph method of an operator: its own name, or name_ where C++ reserves it."""
    return name + "_" if name in CPP_KEYWORDS else name


def _c(text: str) -> str:
    return json.dumps(text)  # (a JSON string is a valid C++ string literal for these names)


def _entry(op) -> str:
    def attrs(items):
        return "{" + ", ".join(f"{{{_c(a.name)}, {_c(a.type)}, {str(a.required).lower()}}}"
                               for a in items) + "}"
    return (f"    {{{_c(op.name)}, {{{_c(op.name)}, {_c(op.kind)}, {{"
            + ", ".join(_c(i) for i in op.inputs) + f"}}, {attrs(op.attrs)}, "
            f"{attrs(op.states)}}}}},\n")


def _methods(op) -> list[str]:
    """The method's overloads: one per number of inputs given (optional ones at the end)."""
    names = [method_name(n) for n in parameters(op)]
    doc = f"  /// {op.name}: {op.doc} ({op.kind}, since {op.since})."
    if op.variadic:
        return [f"{doc}\n  Tensor {method_name(op.name)}(const std::vector<Operand>& "
                f"{names[0]}, const Options& options = {{}}) {{\n"
                f"    return self().op({_c(op.name)}, {names[0]}, options);\n  }}\n"]
    required = len(op.inputs) - len(op.optional_inputs())
    out = []
    for count in range(required, len(names) + 1):
        params = "".join(f"const Operand& {n}, " for n in names[:count])
        out.append(f"{doc}\n  Tensor {method_name(op.name)}({params}const Options& options = {{}}) "
                   f"{{\n    return self().op({_c(op.name)}, {{{', '.join(names[:count])}}}, "
                   f"options);\n  }}\n")
    return out


def files() -> dict[str, str]:
    """sdks/cpp/: include/deepx/generated/operators.hpp, src/generated/table.cpp and
    conformance/methods.hpp."""
    table = operator_table()
    ops = [op for op in table.values() if op.name != "input"]  # (Graph::input is Graph's own)
    methods = [HEADER, "// A method of Graph for every operator of the table: Graph derives from\n"
               "// Operators<Graph>, each method calls Graph::op with the operator's name.\n"
               "#pragma once\n\n#include <vector>\n\nnamespace deepx {\n\n"
               "// The contract this SDK speaks, and its operator table's hash as the gateway's\n"
               "// capabilities give it: Client::check_server compares them.\n"
               f"inline constexpr char kProtocolVersion[] = {_c(protocol_version())};\n"
               f"inline constexpr char kOperatorTableHash[] = {_c(table_hash())};\n\n"
               "template <class G>\nclass Operators {\n public:\n"]
    for op in ops:
        methods.extend(_methods(op))
    methods.append("\n private:\n  G& self() { return static_cast<G&>(*this); }\n};\n\n"
                   "}  // namespace deepx\n")
    table_cpp = [HEADER, '#include "../table.hpp"\n\nnamespace deepx::detail {\n\n'
                 "// The operator table, as the library checks graphs with it.\n"
                 "const std::map<std::string, OpEntry>& operator_table() {\n"
                 "  static const std::map<std::string, OpEntry> table = {\n"]
    table_cpp.extend(_entry(op) for op in table.values())
    table_cpp.append("  };\n  return table;\n}\n\n}  // namespace deepx::detail\n")
    dispatch = [HEADER, "// Every Graph method by its operator's name, for the conformance runner: "
                "how many\n// operands the method takes (-1: a list) and a call of it.\n"
                "#pragma once\n\n#include <functional>\n#include <map>\n#include <string>\n"
                "#include <vector>\n\n#include \"deepx/deepx.hpp\"\n\nnamespace deepx_conformance {\n\n"
                "struct Method {\n  int operands;\n"
                "  std::function<deepx::Tensor(deepx::Graph&, const std::vector<deepx::Operand>&,\n"
                "                              const deepx::Options&)> call;\n};\n\n"
                "inline const std::map<std::string, Method>& methods() {\n"
                "  using deepx::Graph, deepx::Operand, deepx::Options;\n"
                "  static const std::map<std::string, Method> table = {\n"]
    for op in ops:
        name = method_name(op.name)
        if op.variadic:
            arity, call = -1, f"g.{name}(a, o)"
        else:
            arity = len(op.inputs)
            call = f"g.{name}({''.join(f'a[{i}], ' for i in range(arity))}o)"
        operands = "" if arity == 0 else " a"  # (no name where unused: no warning)
        dispatch.append(f"    {{{_c(op.name)}, {{{arity}, [](Graph& g, const std::vector<Operand>&"
                        f"{operands}, const Options& o) {{ return {call}; }}}}}},\n")
    dispatch.append("  };\n  return table;\n}\n\n}  // namespace deepx_conformance\n")
    return {"cpp/include/deepx/generated/operators.hpp": "".join(methods),
            "cpp/src/generated/table.cpp": "".join(table_cpp),
            "cpp/conformance/methods.hpp": "".join(dispatch)}
