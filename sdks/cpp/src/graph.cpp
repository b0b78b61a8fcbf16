// Graph: nodes made and checked with Python's messages (as graph.go does), and the spec.
#include "deepx/graph.hpp"

#include <cmath>
#include <set>

#include "table.hpp"

namespace deepx {

using nlohmann::json;
using detail::OpEntry;

namespace {

Error graph_error(const std::string& node, const std::string& message) {
  return Error("GraphError", message, 0, node);
}

bool ends_with(const std::string& text, const std::string& end) {
  return text.size() >= end.size() && text.compare(text.size() - end.size(), end.size(), end) == 0;
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

std::string listed(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); i++) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

bool is_dtype(const std::string& dtype) {
  for (const auto& d : dtypes()) {
    if (d == dtype) return true;
  }
  return false;
}

void check_shape(const std::vector<int64_t>& shape, const std::string& id) {
  for (int64_t d : shape) {
    if (d < 0) {
      throw graph_error(id, "shape must be a list of non-negative integers, got " + listed(shape));
    }
  }
}

// A number as Python's repr writes it in a message (nan, inf, -inf).
std::string number_shown(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return json(v).dump();
}

void check_inputs(const OpEntry& entry, const std::vector<Operand>& inputs, const std::string& id) {
  size_t required = 0;
  bool variadic = false;
  for (const auto& in : entry.inputs) {
    if (ends_with(in, "...")) variadic = true;
    if (!ends_with(in, "?")) required++;
  }
  size_t given = 0;
  for (size_t i = 0; i < inputs.size(); i++) {
    if (!inputs[i].given()) continue;
    if (given < i) {  // (one left out before it: the operands would shift into its place)
      throw graph_error(id, entry.name + ": input " + std::to_string(i + 1) +
                                " is given after one left out (nullptr); only the last inputs "
                                "may be left out");
    }
    given++;
  }
  size_t count = entry.inputs.size();
  if (variadic) {
    if (given < 1) throw graph_error(id, entry.name + " needs at least one input");
  } else if (entry.kind == "composite" && required != count) {
    if (given < required || given > count) {
      throw graph_error(id, entry.name + " takes " + std::to_string(required) + " to " +
                                std::to_string(count) + " input(s) (" + joined(entry.inputs) +
                                "), got " + std::to_string(given));
    }
  } else if (given != count) {
    std::string names = entry.kind == "composite" ? " (" + joined(entry.inputs) + ")" : "";
    throw graph_error(id, entry.name + " takes " + std::to_string(count) + " input(s)" + names +
                              ", got " + std::to_string(given));
  }
}

// What is wrong with an attribute's value, or "": a spec holds finite numbers, strings,
// bools and lists of them (NaN and the infinities do not cross as JSON).
std::string check_value(const json& value, int depth) {
  if (value.is_number_float()) {
    double v = value.get<double>();
    return std::isfinite(v) ? "" : number_shown(v);
  }
  if (value.is_primitive()) return "";
  if (value.is_array() && depth < 32) {
    for (const auto& item : value) {
      std::string problem = check_value(item, depth + 1);
      if (!problem.empty()) return problem;
    }
    return "";
  }
  return value.is_object() ? "an object" : "a list nested too deep";
}

// The attributes given, checked against the table (nulls dropped: the defaults).
json checked_attrs(const OpEntry& entry, const json& given, const std::string& id) {
  std::vector<std::string> known;
  for (const auto& a : entry.attrs) known.push_back(a.name);
  json out = json::object();
  for (const auto& [key, value] : given.items()) {  // (sorted: the first unknown one named)
    bool found = false;
    for (const auto& k : known) found = found || k == key;
    if (!found) {
      std::string close = closest(key, known);
      throw graph_error(id, entry.name + " has no attribute " + shown(key) + " (allowed: " +
                                (known.empty() ? "none" : joined(known)) + ")" +
                                (close.empty() ? "" : "; did you mean " + shown(close) + "?"));
    }
    if (value.is_null()) continue;
    std::string problem = check_value(value, 0);
    if (!problem.empty()) {
      throw graph_error(id, "attribute " + shown(key) + " is " + problem +
                                ", not a value a spec holds (a finite number, a string, a bool, "
                                "null, or a list of them)");
    }
    out[key] = value;
  }
  for (const auto& a : entry.attrs) {
    if (a.required && !out.contains(a.name)) {
      throw graph_error(id, entry.name + " needs attribute " + shown(a.name));
    }
  }
  return out;
}

}  // namespace

Operand Operand::literal(json value) {
  Operand out;
  out.literal_ = std::move(value);
  return out;
}

Options::Options(std::initializer_list<std::pair<const std::string, json>> fields)
    : fields_(json::object()) {
  for (const auto& [key, value] : fields) fields_[key] = value;
}

Options::Options(const json& fields) : fields_(fields) {
  if (!fields_.is_object()) {
    throw Error("InputError", "options are a JSON object, not " + fields_.dump());
  }
}

Options& Options::set(const std::string& key, json value) {
  fields_[key] = std::move(value);
  return *this;
}

struct Graph::State {
  json inputs = json::object();
  json nodes = json::array();
  std::vector<std::pair<std::string, std::string>> outputs;  // (name, id)
  std::set<std::string> ids;

  // <op>_<n>, n the node's place; past an id taken by a name given, the next free n.
  std::string auto_id(const std::string& name) const {
    for (size_t n = nodes.size();; n++) {
      std::string id = name + "_" + std::to_string(n);
      if (!ids.count(id)) return id;
    }
  }

  void claim(const std::string& id) {
    if (!ids.insert(id).second) throw graph_error(id, "this id is taken by another input or node");
  }
};

Graph::Graph() : state_(std::make_unique<State>()) {}
Graph::Graph(Graph&&) noexcept = default;
Graph& Graph::operator=(Graph&&) noexcept = default;
Graph::~Graph() = default;

Tensor Graph::input(const std::string& name, const std::vector<int64_t>& shape,
                    const std::string& dtype) {
  if (name.empty()) throw Error("GraphError", "an input's name must be a non-empty string");
  check_shape(shape, name);
  if (!is_dtype(dtype)) {
    throw graph_error(name, "unknown dtype " + shown(dtype) + did_you_mean(dtype, dtypes()));
  }
  state_->claim(name);
  state_->inputs[name] = {{"shape", shape}, {"dtype", dtype}};
  return Tensor(state_.get(), name, "input");
}

Tensor Graph::op(const std::string& name, const std::vector<Operand>& inputs,
                 const Options& options) {
  json given = options.fields();
  std::string id = state_->auto_id(name);
  if (given.contains("id") && !given["id"].is_null()) {
    const json& chosen = given["id"];
    if (!chosen.is_string() || chosen.get<std::string>().empty()) {
      throw graph_error(id, "an id is a non-empty string, not " + chosen.dump());
    }
    id = chosen.get<std::string>();
  }
  given.erase("id");
  const auto& table = detail::operator_table();
  auto found = table.find(name);
  if (found == table.end() || name == "input") {
    std::vector<std::string> names;
    for (const auto& [n, entry] : table) {
      if (n != "input") names.push_back(n);
    }
    throw graph_error(id, "unknown operator " + shown(name) + did_you_mean(name, names) +
                              " (see docs/graph-spec.md or `deepx-flow ops` for the list)");
  }
  const OpEntry& entry = found->second;
  check_inputs(entry, inputs, id);
  json node = {{"id", id}, {"op", name}, {"args", json::array()}};
  // (a node may state its shape or dtype: the gateway checks it against its rule)
  for (const char* field : {"shape", "dtype"}) {
    bool stated = given.contains(field) && !given[field].is_null();
    json value = stated ? given[field] : json();
    given.erase(field);
    if (!stated) {
      for (const auto& s : entry.states) {
        if (s.name == field && s.required) {
          throw graph_error(id, name + " needs a declared " + field);
        }
      }
      continue;
    }
    if (std::string(field) == "shape") {
      if (!value.is_array()) throw graph_error(id, "shape must be a list, not " + value.dump());
      std::vector<int64_t> shape;
      for (const auto& d : value) {
        if (!d.is_number_integer()) {
          throw graph_error(id, "shape must be a list of non-negative integers, got " + value.dump());
        }
        shape.push_back(d.get<int64_t>());
      }
      check_shape(shape, id);
      node["shape"] = shape;
    } else {
      if (!value.is_string() || !is_dtype(value.get<std::string>())) {
        throw graph_error(id, "unknown dtype " + (value.is_string() ? shown(value.get<std::string>())
                                                                     : value.dump()));
      }
      node["dtype"] = value;
    }
  }
  json attrs = checked_attrs(entry, given, id);
  for (const Operand& operand : inputs) {
    if (!operand.given()) continue;  // (an optional input left out: only at the end)
    if (const Tensor* t = operand.tensor()) {
      if (t->graph_ != state_.get()) {
        throw Error("GraphError", "an operand of " + shown(id) + " is not a tensor of this graph");
      }
      node["args"].push_back(t->id());
      continue;
    }
    const json& v = operand.value();
    if (v.is_number_float() && !std::isfinite(v.get<double>())) {
      throw graph_error(id, "an operand is " + number_shown(v.get<double>()) +
                                ", not a finite number");
    }
    if (!v.is_number() && !v.is_boolean()) {
      throw graph_error(id, "an operand is " + v.dump() +
                                ", not a tensor of this graph or a number");
    }
    node["args"].push_back(v);
  }
  if (!attrs.empty()) node["attrs"] = attrs;
  state_->claim(id);
  state_->nodes.push_back(std::move(node));
  return Tensor(state_.get(), id, name);
}

Graph& Graph::output(const Tensor& tensor, const std::string& name) {
  if (tensor.graph_ != state_.get()) {
    throw Error("GraphError", "an output is not a tensor of this graph");
  }
  std::string named = name.empty() ? tensor.id() : name;
  for (const auto& [n, id] : state_->outputs) {
    if (n == named) throw Error("GraphError", "output " + shown(named) + " is named twice");
  }
  state_->outputs.emplace_back(named, tensor.id());
  return *this;
}

json Graph::spec() const {
  if (state_->outputs.empty()) {
    throw Error("GraphError", "the graph has no outputs: name at least one (graph.output)");
  }
  json outputs = json::array();
  for (const auto& [name, id] : state_->outputs) {
    if (name == id) {
      outputs.push_back(id);
    } else {
      outputs.push_back(json::object({{name, id}}));
    }
  }
  return {{"deepx", 1}, {"inputs", state_->inputs}, {"nodes", state_->nodes}, {"outputs", outputs}};
}

}  // namespace deepx
