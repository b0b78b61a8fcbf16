// Graphs, values and messages, without a gateway: the spec the operators build, Python's
// words for every mistake, difflib's "did you mean", values as exact bytes.
#include <cmath>

#include "check.hpp"
#include "conformance/methods.hpp"
#include "deepx/deepx.hpp"
#include "src/table.hpp"

using nlohmann::json;

TEST(operators_build_the_canonical_spec) {
  deepx::Graph g;
  auto x = g.input("x", {2, 3});
  auto y = g.relu(g.add(x, 1.5));
  auto s = g.sum(y, {{"axes", {1}}, {"keepdims", true}, {"id", "total"}});
  auto m = g.argmax(x, {{"axis", -1}});
  g.output(s).output(m, "label");
  json want = json::parse(R"({"deepx": 1, "inputs": {"x": {"shape": [2, 3], "dtype": "float32"}},
    "nodes": [{"id": "add_0", "op": "add", "args": ["x", 1.5]},
              {"id": "relu_1", "op": "relu", "args": ["add_0"]},
              {"id": "total", "op": "sum", "args": ["relu_1"], "attrs": {"axes": [1], "keepdims": true}},
              {"id": "argmax_3", "op": "argmax", "args": ["x"], "attrs": {"axis": -1}}],
    "outputs": ["total", {"label": "argmax_3"}]})");
  CHECK_EQ(g.spec().dump(), want.dump());
}

TEST(sources_state_and_optional_inputs_may_be_left_out) {
  deepx::Graph g;
  auto f = g.full({{"shape", {2}}, {"dtype", "float64"}, {"value", 2}});
  auto x = g.input("x", {4, 5});
  auto n = g.layer_norm(x, {{"eps", 0.001}});
  auto c = g.concat({x, x}, {{"axis", 0}});
  auto t = g.conv_transpose(x, x);  // (b? left out)
  g.output(f).output(n).output(c).output(t);
  CHECK_EQ(g.spec()["nodes"].dump(),
           std::string(R"([{"args":[],"attrs":{"value":2},"dtype":"float64","id":"full_0","op":"full","shape":[2]},)"
                       R"({"args":["x"],"attrs":{"eps":0.001},"id":"layer_norm_1","op":"layer_norm"},)"
                       R"({"args":["x","x"],"attrs":{"axis":0},"id":"concat_2","op":"concat"},)"
                       R"({"args":["x","x"],"id":"conv_transpose_3","op":"conv_transpose"}])"));
}

TEST(mistakes_throw_with_pythons_messages) {
  std::vector<std::pair<std::function<void(deepx::Graph&, const deepx::Tensor&)>, std::string>> cases = {
      {[](auto& g, auto& x) { g.op("relux", {x}); },
       "node 'relux_0': unknown operator 'relux' (did you mean 'relu'?) (see docs/graph-spec.md or "
       "`deepx-flow ops` for the list)"},
      {[](auto& g, auto& x) { g.op("add", {x}); }, "node 'add_0': add takes 2 input(s), got 1"},
      {[](auto& g, auto& x) { g.add(x, nullptr); }, "node 'add_0': add takes 2 input(s), got 1"},
      {[](auto& g, auto& x) { g.sum(x, {{"axis", 1}}); },
       "node 'sum_0': sum has no attribute 'axis' (allowed: axes, keepdims); did you mean 'axes'?"},
      {[](auto& g, auto& x) { g.one_hot(x); }, "node 'one_hot_0': one_hot needs attribute 'classes'"},
      {[](auto& g, auto& x) { g.op("leaky_relu", {x, x}); },
       "node 'leaky_relu_0': leaky_relu takes 1 input(s) (x), got 2"},
      {[](auto& g, auto&) { g.full({{"shape", {1}}, {"dtype", "float32"}}); },
       "node 'full_0': full needs attribute 'value'"},
      {[](auto& g, auto&) { g.full({{"dtype", "float32"}, {"value", 1}}); },
       "node 'full_0': full needs a declared shape"},
      {[](auto& g, auto& x) { g.leaky_relu(x, {{"alpha", INFINITY}}); },
       "node 'leaky_relu_0': attribute 'alpha' is inf, not a value a spec holds (a finite number, a "
       "string, a bool, null, or a list of them)"},
      {[](auto& g, auto& x) { g.mul(x, NAN); }, "node 'mul_0': an operand is nan, not a finite number"},
      {[](auto& g, auto& x) { g.layer_norm(x, nullptr, x); },
       "node 'layer_norm_0': layer_norm: input 3 is given after one left out (nullptr); only the last "
       "inputs may be left out"},
      {[](auto& g, auto&) {
         deepx::Graph other;
         g.relu(other.input("y", {1}));
       },
       "an operand of 'relu_0' is not a tensor of this graph"},
      {[](auto& g, auto&) { g.input("x", {1}); }, "node 'x': this id is taken by another input or node"},
      {[](auto& g, auto&) { g.input("z", {1}, "float8"); }, "node 'z': unknown dtype 'float8' (did you mean 'float64'?)"},
      {[](auto& g, auto&) { g.input("z", {2, -1}); },
       "node 'z': shape must be a list of non-negative integers, got [2, -1]"},
      {[](auto& g, auto& x) { g.output(x).output(g.relu(x), "x"); }, "output 'x' is named twice"},
      {[](auto& g, auto&) { g.spec(); }, "the graph has no outputs: name at least one (graph.output)"},
  };
  for (const auto& [build, says] : cases) {
    deepx::Graph g;
    auto x = g.input("x", {2, 3});
    deepx::Error err = THROWN(build(g, x));
    CHECK_EQ(std::string(err.what()), says);
    CHECK_EQ(err.kind(), std::string("GraphError"));
  }
}

TEST(an_error_says_its_node_apart_from_its_message) {
  deepx::Graph g;
  deepx::Error err = THROWN(g.op("add", {g.input("x", {1})}, {{"id", "y"}}));
  CHECK_EQ(err.node(), std::string("y"));
  CHECK_EQ(err.message(), std::string("add takes 2 input(s), got 1"));
  CHECK_EQ(err.status(), 0);
}

TEST(closest_spells_as_difflib) {
  std::vector<std::string> choices = {"relu", "gelu", "exp", "sum", "mean"};
  CHECK_EQ(deepx::closest("relux", choices), std::string("relu"));
  CHECK_EQ(deepx::closest("Sum", choices), std::string("sum"));
  CHECK_EQ(deepx::closest("zzz", choices), std::string(""));
  // (a tie: difflib keeps the larger word; "gelu" and "relu" are both 0.75 from "xelu")
  CHECK_EQ(deepx::closest("xelu", choices), std::string("relu"));
  CHECK_EQ(deepx::closest("flaot32", deepx::dtypes()), std::string("float32"));
}

TEST(every_operator_but_input_is_a_method) {
  const auto& methods = deepx_conformance::methods();
  for (const auto& [name, entry] : deepx::detail::operator_table()) {
    if (name != "input") CHECK(methods.count(name) == 1);
  }
  CHECK_EQ(methods.size() + 1, deepx::detail::operator_table().size());
}

TEST(values_cross_as_bytes_exactly) {
  int64_t big = (int64_t{1} << 62) + 1;
  deepx::Values v({2}, std::vector<int64_t>{big, -3});
  CHECK_EQ(v.dtype(), std::string("int64"));
  CHECK_EQ(v.bytes().size(), size_t{16});
  deepx::Values back("int64", {2}, v.bytes());
  CHECK_EQ(back.data<int64_t>(), (std::vector<int64_t>{big, -3}));
  CHECK_EQ(std::string(THROWN(deepx::Values({3}, std::vector<float>{1, 2})).what()),
           std::string("2 values, but shape [3] holds 3"));
  CHECK_EQ(THROWN(deepx::Values({1}, std::vector<float>{1}, "int32")).kind(), std::string("InputError"));
  CHECK_EQ(THROWN(v.data<double>()).kind(), std::string("InputError"));
  deepx::Values flags({3}, std::vector<bool>{true, false, true});
  CHECK_EQ(flags.bytes(), (std::vector<uint8_t>{1, 0, 1}));
  CHECK_EQ(flags.data<bool>(), (std::vector<bool>{true, false, true}));
  deepx::Values scalar({}, std::vector<double>{2.5});
  CHECK_EQ(scalar.size(), size_t{1});
}

TEST(sixteen_bit_floats_convert_both_ways) {
  deepx::Values half({2}, std::vector<uint16_t>{0x3c00, 0xc000}, "float16");
  deepx::Values brain({2}, std::vector<uint16_t>{0x3f80, 0x4049}, "bfloat16");
  CHECK_EQ(half.to_float32(), (std::vector<float>{1, -2}));
  CHECK_EQ(brain.to_float32(), (std::vector<float>{1, 3.140625f}));
  CHECK_EQ(deepx::float32_to_float16(65504.0f), uint16_t{0x7bff});
  CHECK_EQ(deepx::float32_to_float16(1e6f), uint16_t{0x7c00});
  CHECK_EQ(deepx::float32_to_float16(-0.0f), uint16_t{0x8000});
  CHECK_EQ(deepx::float32_to_float16(std::ldexp(1.0f, -24)), uint16_t{0x0001});
  CHECK_EQ(deepx::float32_to_float16(1.0f + std::ldexp(1.0f, -11)), uint16_t{0x3c00});  // (a tie: to even)
  CHECK_EQ(deepx::float32_to_bfloat16(3.140625f), uint16_t{0x4049});
  CHECK(std::isnan(deepx::float16_to_float32(deepx::float32_to_float16(NAN))));
  CHECK_EQ(THROWN(deepx::Values({1}, std::vector<float>{1}).to_float32()).kind(), std::string("InputError"));
}

TEST(large_integers_are_written_as_given) {
  deepx::Graph g;
  auto x = g.input("x", {2}, "int64");
  int64_t big = (int64_t{1} << 62) + 1;
  g.output(g.add(x, big, {{"id", "y"}}));
  g.output(g.random_normal({{"shape", {1}}, {"dtype", "float32"}, {"seed", (int64_t{1} << 60) + 1}}), "r");
  CHECK_EQ(g.spec()["nodes"].dump(),
           std::string(R"([{"args":["x",4611686018427387905],"id":"y","op":"add"},)"
                       R"({"args":[],"attrs":{"seed":1152921504606846977},"dtype":"float32","id":"random_normal_1","op":"random_normal","shape":[1]}])"));
}

TEST(a_node_may_state_its_shape_and_ids_made_do_not_take_a_name_given) {
  deepx::Graph g;
  auto x = g.input("x", {2, 3});
  g.relu(x, {{"id", "relu_1"}});
  auto y = g.relu(x, {{"shape", {2, 3}}});
  CHECK_EQ(y.id(), std::string("relu_2"));
  CHECK_EQ(g.op("cast", {x}, deepx::Options().set("dtype", "float64")).id(), std::string("cast_2"));
}

TEST(literals_keep_their_kind) {
  deepx::Graph g;
  auto x = g.input("x", {2});
  g.output(g.mul(x, 2.0)).output(g.mul(x, 2)).output(g.where(x, true, false));
  CHECK_EQ(g.spec()["nodes"][0]["args"].dump(), std::string(R"(["x",2.0])"));
  CHECK_EQ(g.spec()["nodes"][1]["args"].dump(), std::string(R"(["x",2])"));
  CHECK_EQ(g.spec()["nodes"][2]["args"].dump(), std::string(R"(["x",true,false])"));
}

int main() { return check::run_all(); }
