// The C API (include/deepx/deepx.h) over the C++ library: each call runs in guarded(), which
// turns an exception into a status and this thread's last error.
#include "deepx/deepx.h"

#include <cstring>

#include "deepx/deepx.hpp"

using nlohmann::json;

struct deepx_graph {
  deepx::Graph graph;
  std::map<std::string, deepx::Tensor> tensors;  // (by id: the keys are the ids C holds)
};

struct deepx_values {
  deepx::Values values;
};

struct deepx_client {
  deepx::Client client;
};

struct deepx_operation {
  deepx::Operation operation;
  std::string fields;
  std::map<std::string, deepx_values> outputs;
  std::vector<const char*> names;
};

namespace {

struct LastError {
  std::string message, kind;
  int status = 0;
};
thread_local LastError last;

struct Invalid : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class Body>
int guarded(Body&& body) {
  try {
    body();
    return DEEPX_OK;
  } catch (const deepx::Error& err) {
    last = {err.what(), err.kind(), err.status()};
    return DEEPX_ERROR;
  } catch (const Invalid& err) {
    last = {err.what(), "InvalidArgument", 0};
    return DEEPX_INVALID;
  } catch (const std::exception& err) {
    last = {err.what(), "InternalError", 0};
    return DEEPX_INTERNAL;
  } catch (...) {
    last = {"an unknown exception", "InternalError", 0};
    return DEEPX_INTERNAL;
  }
}

template <class T>
T* needed(T* handle, const char* what) {
  if (handle == nullptr) throw Invalid(std::string(what) + " is NULL");
  return handle;
}

json json_arg(const char* text, const char* what, json otherwise) {
  if (text == nullptr) return otherwise;
  json out = json::parse(text, nullptr, false);
  if (out.is_discarded()) throw deepx::Error("InputError", std::string(what) + " is not JSON: " + text);
  return out;
}

deepx::Options options_of(const char* text) {
  return deepx::Options(json_arg(text, "options_json", json::object()));
}

char* copied(const std::string& text) {
  char* out = static_cast<char*>(std::malloc(text.size() + 1));
  if (out == nullptr) throw std::bad_alloc();
  std::memcpy(out, text.c_str(), text.size() + 1);
  return out;
}

void give(char** to, const json& value) { *needed(to, "json") = copied(value.dump()); }

const char* added(deepx_graph* graph, const deepx::Tensor& tensor) {
  return graph->tensors.insert_or_assign(tensor.id(), tensor).first->first.c_str();
}

const deepx::Tensor& tensor_of(const deepx_graph* graph, const std::string& id) {
  auto found = graph->tensors.find(id);
  if (found == graph->tensors.end()) {
    throw deepx::Error("GraphError", "no tensor of this graph has the id " + deepx::shown(id));
  }
  return found->second;
}

deepx::Inputs inputs_of(const char* const* names, const deepx_values* const* values, size_t count) {
  deepx::Inputs out;
  for (size_t i = 0; i < count; i++) {
    const char* name = needed(needed(names, "names")[i], "a name");
    out[name] = needed(needed(values, "values")[i], "a value")->values;
  }
  return out;
}

void give(deepx_operation** out, deepx::Operation operation) {
  auto made = std::make_unique<deepx_operation>();
  made->operation = std::move(operation);
  made->fields = made->operation.fields.dump();
  for (auto& [name, values] : made->operation.outputs) made->outputs[name] = deepx_values{std::move(values)};
  made->operation.outputs.clear();  // (held once: as the C handles)
  for (const auto& [name, values] : made->outputs) made->names.push_back(name.c_str());
  *out = made.release();
}

}  // namespace

extern "C" {

const char* deepx_error_message(void) { return last.message.c_str(); }
const char* deepx_error_kind(void) { return last.kind.c_str(); }
int deepx_error_status(void) { return last.status; }
void deepx_free(char* text) { std::free(text); }

int deepx_graph_new(deepx_graph** out) {
  return guarded([&] { *needed(out, "out") = new deepx_graph(); });
}

void deepx_graph_free(deepx_graph* graph) { delete graph; }

int deepx_graph_input(deepx_graph* graph, const char* name, const int64_t* shape, size_t rank,
                      const char* dtype, const char** id) {
  return guarded([&] {
    std::vector<int64_t> dims(rank ? needed(shape, "shape") : shape, rank ? shape + rank : shape);
    deepx::Tensor t = needed(graph, "graph")->graph.input(needed(name, "name"), dims,
                                                          dtype ? dtype : "float32");
    const char* made = added(graph, t);
    if (id) *id = made;
  });
}

int deepx_graph_op(deepx_graph* graph, const char* name, const char* const* inputs,
                   size_t count, const char* options_json, const char** id) {
  return guarded([&] {
    std::vector<deepx::Operand> operands;
    for (size_t i = 0; i < count; i++) {
      operands.push_back(needed(inputs, "inputs")[i] ? deepx::Operand(tensor_of(needed(graph, "graph"), inputs[i]))
                                                     : deepx::Operand());
    }
    deepx::Tensor t = needed(graph, "graph")->graph.op(needed(name, "name"), operands, options_of(options_json));
    const char* made = added(graph, t);
    if (id) *id = made;
  });
}

int deepx_graph_op_json(deepx_graph* graph, const char* name, const char* args_json,
                        const char* options_json, const char** id) {
  return guarded([&] {
    json args = json_arg(args_json, "args_json", json::array());
    if (!args.is_array()) throw deepx::Error("InputError", "args_json is a JSON array, not " + args.dump());
    std::vector<deepx::Operand> operands;
    for (const auto& arg : args) {
      operands.push_back(arg.is_string() ? deepx::Operand(tensor_of(needed(graph, "graph"), arg.get<std::string>()))
                                         : deepx::Operand::literal(arg));
    }
    deepx::Tensor t = needed(graph, "graph")->graph.op(needed(name, "name"), operands, options_of(options_json));
    const char* made = added(graph, t);
    if (id) *id = made;
  });
}

int deepx_graph_output(deepx_graph* graph, const char* id, const char* name) {
  return guarded([&] {
    needed(graph, "graph")->graph.output(tensor_of(graph, needed(id, "id")), name ? name : "");
  });
}

int deepx_graph_spec(const deepx_graph* graph, char** json) {
  return guarded([&] { give(json, needed(graph, "graph")->graph.spec()); });
}

int deepx_values_new(const char* dtype, const int64_t* shape, size_t rank, const void* data,
                     size_t nbytes, deepx_values** out) {
  return guarded([&] {
    std::vector<int64_t> dims(rank ? needed(shape, "shape") : shape, rank ? shape + rank : shape);
    const auto* bytes = static_cast<const uint8_t*>(nbytes ? needed(data, "data") : data);
    *needed(out, "out") = new deepx_values{
        deepx::Values(needed(dtype, "dtype"), dims, std::vector<uint8_t>(bytes, bytes + nbytes))};
  });
}

void deepx_values_free(deepx_values* values) { delete values; }
const char* deepx_values_dtype(const deepx_values* v) { return v ? v->values.dtype().c_str() : ""; }
size_t deepx_values_rank(const deepx_values* v) { return v ? v->values.shape().size() : 0; }
const int64_t* deepx_values_shape(const deepx_values* v) { return v ? v->values.shape().data() : nullptr; }
size_t deepx_values_count(const deepx_values* v) { return v ? v->values.size() : 0; }
const void* deepx_values_data(const deepx_values* v) { return v ? v->values.bytes().data() : nullptr; }
size_t deepx_values_nbytes(const deepx_values* v) { return v ? v->values.bytes().size() : 0; }

int deepx_values_to_float32(const deepx_values* values, float* out, size_t count) {
  return guarded([&] {
    std::vector<float> floats = needed(values, "values")->values.to_float32();
    if (count < floats.size()) throw Invalid("out holds fewer values than the tensor has");
    std::copy(floats.begin(), floats.end(), needed(out, "out"));
  });
}

int deepx_client_new(const char* url, const char* token, deepx_client** out) {
  return guarded([&] {
    *needed(out, "out") = new deepx_client{
        deepx::Client(needed(url, "url"), token ? token : deepx::Client::default_token())};
  });
}

void deepx_client_free(deepx_client* client) { delete client; }

const char* deepx_protocol_version(void) { return deepx::kProtocolVersion; }
const char* deepx_operator_table_hash(void) { return deepx::kOperatorTableHash; }

int deepx_client_check_server(deepx_client* client, char** json) {
  return guarded([&] { give(json, needed(client, "client")->client.check_server()); });
}

int deepx_client_analyze(deepx_client* client, const deepx_graph* graph, char** json) {
  return guarded([&] { give(json, needed(client, "client")->client.analyze(needed(graph, "graph")->graph)); });
}

int deepx_client_execute(deepx_client* client, const deepx_graph* graph, const char* const* names,
                         const deepx_values* const* values, size_t count, const char* options_json,
                         deepx_operation** out) {
  return guarded([&] {
    give(needed(out, "out"), needed(client, "client")->client.execute(
        needed(graph, "graph")->graph, inputs_of(names, values, count),
        json_arg(options_json, "options_json", json::object())));
  });
}

int deepx_client_execute_spec(deepx_client* client, const char* spec_json, const char* const* names,
                              const deepx_values* const* values, size_t count, const char* options_json,
                              deepx_operation** out) {
  return guarded([&] {
    give(needed(out, "out"), needed(client, "client")->client.execute(
        json_arg(needed(spec_json, "spec_json"), "spec_json", nullptr), inputs_of(names, values, count),
        json_arg(options_json, "options_json", json::object())));
  });
}

int deepx_client_operation(deepx_client* client, const char* id, double wait_seconds, deepx_operation** out) {
  return guarded([&] {
    give(needed(out, "out"), needed(client, "client")->client.operation(needed(id, "id"), wait_seconds));
  });
}

int deepx_client_cancel(deepx_client* client, const char* id, deepx_operation** out) {
  return guarded([&] { give(needed(out, "out"), needed(client, "client")->client.cancel(needed(id, "id"))); });
}

int deepx_client_runs(deepx_client* client, const char* status, int limit, char** json) {
  return guarded([&] { give(json, needed(client, "client")->client.runs(status ? status : "", limit)); });
}

int deepx_client_run(deepx_client* client, const char* id, char** json) {
  return guarded([&] { give(json, needed(client, "client")->client.run(needed(id, "id"))); });
}

int deepx_client_define_asset(deepx_client* client, const char* name, const deepx_graph* graph,
                              const char* options_json, char** json) {
  return guarded([&] {
    auto answer = needed(client, "client")->client.define_asset(
        needed(name, "name"), needed(graph, "graph")->graph,
        json_arg(options_json, "options_json", json::object()));
    if (json) give(json, answer);
  });
}

int deepx_client_assets(deepx_client* client, char** json) {
  return guarded([&] { give(json, needed(client, "client")->client.assets()); });
}

int deepx_client_asset_versions(deepx_client* client, const char* name, char** json) {
  return guarded([&] { give(json, needed(client, "client")->client.asset_versions(needed(name, "name"))); });
}

int deepx_client_materialize(deepx_client* client, const char* name, const char* options_json,
                             deepx_operation** out) {
  return guarded([&] {
    give(needed(out, "out"), needed(client, "client")->client.materialize(
        needed(name, "name"), json_arg(options_json, "options_json", json::object())));
  });
}

int deepx_client_read_asset(deepx_client* client, const char* name, const char* options_json,
                            deepx_values** out) {
  return guarded([&] {
    deepx::Values read = needed(client, "client")->client.read_asset(
        needed(name, "name"), json_arg(options_json, "options_json", json::object()));
    *needed(out, "out") = new deepx_values{std::move(read)};
  });
}

int deepx_client_infer(deepx_client* client, const char* model, const char* const* names,
                       const deepx_values* const* values, size_t count, deepx_operation** out) {
  return guarded([&] {
    give(needed(out, "out"), needed(client, "client")->client.infer(needed(model, "model"),
                                                                    inputs_of(names, values, count)));
  });
}

void deepx_operation_free(deepx_operation* operation) { delete operation; }
const char* deepx_operation_id(const deepx_operation* o) { return o ? o->operation.id.c_str() : ""; }
const char* deepx_operation_state(const deepx_operation* o) { return o ? o->operation.state.c_str() : ""; }
const char* deepx_operation_run_id(const deepx_operation* o) { return o ? o->operation.run_id.c_str() : ""; }
const char* deepx_operation_error(const deepx_operation* o) { return o ? o->operation.error.c_str() : ""; }
const char* deepx_operation_fields(const deepx_operation* o) { return o ? o->fields.c_str() : "{}"; }
size_t deepx_operation_output_count(const deepx_operation* o) { return o ? o->names.size() : 0; }

const char* deepx_operation_output_name(const deepx_operation* o, size_t index) {
  return o && index < o->names.size() ? o->names[index] : nullptr;
}

const deepx_values* deepx_operation_output(const deepx_operation* o, const char* name) {
  if (o == nullptr || name == nullptr) return nullptr;
  auto found = o->outputs.find(name);
  return found == o->outputs.end() ? nullptr : &found->second;
}

}  // extern "C"
