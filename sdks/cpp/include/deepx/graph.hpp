// Building a graph: a Graph holds its nodes in the order they were made, each Tensor is one
// of them. Operators are checked as they are applied (name, number of inputs, attributes),
// with Python's messages, and a mistake throws deepx::Error (kind GraphError) where it is
// made; shapes and dtypes are the gateway's to infer (Client::analyze). spec() is the graph
// spec (docs/graph-spec.md) the gateway reads: node ids are the ids given ({"id", "total"})
// or <op>_<n> in the order the nodes were made; attributes are those given; literals stay
// numbers in "args", written as given (an int stays an int, 2.0 a float).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "deepx/error.hpp"
#include "deepx/values.hpp"

namespace deepx {

class Graph;

// One node of a graph: an input, or an operator applied to tensors and numbers.
class Tensor {
 public:
  const std::string& id() const noexcept { return id_; }
  const std::string& op() const noexcept { return op_; }

 private:
  friend class Graph;
  Tensor(const void* graph, std::string id, std::string op)
      : graph_(graph), id_(std::move(id)), op_(std::move(op)) {}
  const void* graph_;
  std::string id_, op_;
};

// An operator's operand: a Tensor of the same graph, a number or a bool (a literal in the
// spec), or nothing (Operand() or nullptr: an optional input left out).
class Operand {
 public:
  Operand() = default;
  Operand(std::nullptr_t) {}
  Operand(const Tensor& tensor) : tensor_(std::make_shared<Tensor>(tensor)) {}
  Operand(bool value) : literal_(value) {}
  Operand(int value) : literal_(value) {}
  Operand(long value) : literal_(value) {}
  Operand(long long value) : literal_(value) {}
  Operand(unsigned value) : literal_(value) {}
  Operand(unsigned long value) : literal_(value) {}
  Operand(unsigned long long value) : literal_(value) {}
  Operand(double value) : literal_(value) {}
  Operand(float value) : literal_(static_cast<double>(value)) {}
  // (text is no operand: a tensor is given as its Tensor, not its id; without this a string
  // literal would become the bool true)
  Operand(const char*) = delete;
  // A literal as JSON holds it (the conformance runner's numbers, as the cases write them).
  static Operand literal(nlohmann::json value);

  bool given() const noexcept { return tensor_ != nullptr || !literal_.is_null(); }
  const Tensor* tensor() const noexcept { return tensor_.get(); }
  const nlohmann::json& value() const noexcept { return literal_; }

 private:
  std::shared_ptr<Tensor> tensor_;
  nlohmann::json literal_;
};

// Options of an operator call: its attributes by name, and "id" (the node's id), "shape"
// and "dtype" (what a node that states them states):
//   g.sum(x, {{"axes", {1}}, {"keepdims", true}, {"id", "total"}})
// A null attribute is the operator's default (left out of the spec).
class Options {
 public:
  Options() : fields_(nlohmann::json::object()) {}
  Options(std::initializer_list<std::pair<const std::string, nlohmann::json>> fields);
  // Options from a JSON object (InputError for anything else).
  explicit Options(const nlohmann::json& fields);

  Options& set(const std::string& key, nlohmann::json value);
  const nlohmann::json& fields() const noexcept { return fields_; }

 private:
  nlohmann::json fields_;
};

}  // namespace deepx

#include "deepx/generated/operators.hpp"

namespace deepx {

class Graph : public Operators<Graph> {
 public:
  Graph();
  Graph(Graph&&) noexcept;
  Graph& operator=(Graph&&) noexcept;
  Graph(const Graph&) = delete;  // (its tensors know it by its address)
  Graph& operator=(const Graph&) = delete;
  ~Graph();

  // A named input of shape and dtype (see dtypes()).
  Tensor input(const std::string& name, const std::vector<int64_t>& shape,
               const std::string& dtype = "float32");
  // Any operator by name; every operator of the table also has a method of its own
  // (generated/operators.hpp).
  Tensor op(const std::string& name, const std::vector<Operand>& inputs,
            const Options& options = {});
  // Names tensor as an output of the graph (its id, where name is "").
  Graph& output(const Tensor& tensor, const std::string& name = "");
  // The graph spec the gateway reads.
  nlohmann::json spec() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace deepx
