// The operator table as the library checks graphs with it (src/generated/table.cpp, written
// by sdks/generate.py from deepx_flow/ops/operators.yaml).
#pragma once

#include <map>
#include <string>
#include <vector>

namespace deepx::detail {

struct AttrEntry {
  std::string name, type;
  bool required;
};

struct OpEntry {
  std::string name, kind;
  std::vector<std::string> inputs;  // ("x", "b?" optional, "tensors..." any number)
  std::vector<AttrEntry> attrs;     // (in the table's order)
  std::vector<AttrEntry> states;    // (shape, dtype: what a node of it states)
};

const std::map<std::string, OpEntry>& operator_table();

}  // namespace deepx::detail
