// The conformance suite's runner for C++ (sdks/conformance/run.sh calls it through
// conformance.sh): each case is built through the SDK's public API (its steps, each by the
// generated method of its operator: methods.hpp) and must give the stored graph spec; then it
// runs on the gateway and must give the stored outputs. Scenarios make their calls in order.
// Every file runs over HTTP (DEEPX_URL) and over gRPC (DEEPX_GRPC, host:port); prints each
// failure and one line per transport: `cpp http: N passed, N failed`.
//
//   conformance CASES_FOLDER [SCENARIOS_FOLDER ...]
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <cstring>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include "deepx/deepx.hpp"
#include "methods.hpp"

using deepx::Values;
using nlohmann::json;

namespace {

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string listed(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); i++) out += (i ? " " : "") + std::to_string(shape[i]);
  return out + "]";
}

// The case's graph, made by calling the method named by each step.
deepx::Graph built(const json& c) {
  deepx::Graph g;
  std::map<std::string, deepx::Tensor> tensors;
  for (const auto& step : c["steps"]) {
    if (step.contains("input")) {
      std::string name = step["input"];
      tensors.insert_or_assign(name, g.input(name, step["shape"].get<std::vector<int64_t>>(), step["dtype"]));
      continue;
    }
    std::string op = step["op"];
    std::vector<deepx::Operand> operands;
    for (const auto& a : step["args"]) {
      if (a.is_string()) {
        auto found = tensors.find(a.get<std::string>());
        if (found == tensors.end()) throw Failure("step " + op + ": no tensor " + a.dump());
        operands.emplace_back(found->second);
      } else {
        operands.push_back(deepx::Operand::literal(a));
      }
    }
    deepx::Options options(step.value("attrs", json::object()));
    options.set("id", step["id"]);
    for (const char* field : {"shape", "dtype"}) {
      if (step.contains(field)) options.set(field, step[field]);
    }
    const auto& methods = deepx_conformance::methods();
    auto method = methods.find(op);
    deepx::Tensor made = [&] {
      // (the generic op for a name the table lacks, or more operands than its method takes:
      // a mistake C++'s types keep out of the method itself)
      if (method == methods.end() ||
          (method->second.operands >= 0 && operands.size() > static_cast<size_t>(method->second.operands))) {
        return g.op(op, operands, options);
      }
      if (method->second.operands >= 0) operands.resize(method->second.operands);  // (left out: Operand())
      return method->second.call(g, operands, options);
    }();
    tensors.insert_or_assign(step["id"].get<std::string>(), made);
  }
  for (const auto& o : c["outputs"]) {
    g.output(tensors.at(o[1].get<std::string>()), o[0].get<std::string>());
  }
  return g;
}

void same_spec(const deepx::Graph& g, const json& stored) {
  // (both written as nlohmann writes them: keys sorted, numbers as written)
  std::string made = g.spec().dump();
  if (made != stored.dump()) throw Failure("the graph the steps build: " + made);
}

double number(const json& v) {
  if (v.is_string()) {
    std::string s = v;
    if (s == "NaN") return NAN;
    if (s == "Infinity") return INFINITY;
    if (s == "-Infinity") return -INFINITY;
    return std::stod(s);
  }
  if (v.is_boolean()) return v.get<bool>();
  return v.get<double>();
}

template <class T>
std::vector<T> each(const std::vector<json>& data, T (*convert)(const json&)) {
  std::vector<T> out;
  for (const auto& x : data) out.push_back(convert(x));
  return out;
}

// A case's tensor as Values (int64 and uint64 as decimal strings; 16-bit floats as their
// patterns; a pattern's value i is (i mod modulo) * scale).
Values values(const json& t) {
  std::string dtype = t["dtype"];
  std::vector<int64_t> shape = t["shape"].get<std::vector<int64_t>>();
  std::vector<json> data;
  if (t.contains("pattern")) {
    size_t n = 1;
    for (int64_t d : shape) n *= d;
    int64_t modulo = t["pattern"]["modulo"];
    double scale = t["pattern"]["scale"];
    data.reserve(n);
    for (size_t i = 0; i < n; i++) data.emplace_back(static_cast<double>(i % modulo) * scale);
  } else {
    data = t["data"].get<std::vector<json>>();
  }
  auto as = [](const json& x) { return number(x); };
  if (dtype == "bool") return Values(shape, each<bool>(data, [](const json& x) { return x.get<bool>(); }));
  if (dtype == "int8") return Values(shape, each<int8_t>(data, [](const json& x) { return static_cast<int8_t>(number(x)); }));
  if (dtype == "int16") return Values(shape, each<int16_t>(data, [](const json& x) { return static_cast<int16_t>(number(x)); }));
  if (dtype == "int32") return Values(shape, each<int32_t>(data, [](const json& x) { return static_cast<int32_t>(number(x)); }));
  if (dtype == "uint8") return Values(shape, each<uint8_t>(data, [](const json& x) { return static_cast<uint8_t>(number(x)); }));
  if (dtype == "uint32") return Values(shape, each<uint32_t>(data, [](const json& x) { return static_cast<uint32_t>(number(x)); }));
  if (dtype == "uint16" || dtype == "float16" || dtype == "bfloat16") {
    return Values(shape, each<uint16_t>(data, [](const json& x) { return static_cast<uint16_t>(number(x)); }), dtype);
  }
  if (dtype == "int64") {  // (decimal strings: exact past 2**53)
    return Values(shape, each<int64_t>(data, [](const json& x) { return static_cast<int64_t>(std::stoll(x.get<std::string>())); }));
  }
  if (dtype == "uint64") {
    return Values(shape, each<uint64_t>(data, [](const json& x) { return static_cast<uint64_t>(std::stoull(x.get<std::string>())); }));
  }
  if (dtype == "float32") return Values(shape, each<float>(data, [](const json& x) { return static_cast<float>(number(x)); }));
  if (dtype == "float64") return Values(shape, each<double>(data, +as));
  throw Failure("no conversion for " + dtype);
}

std::vector<double> flat(const Values& v) {
  const std::string& d = v.dtype();
  auto wide = [](const auto& items) { return std::vector<double>(items.begin(), items.end()); };
  if (d == "bool") return wide(v.data<bool>());
  if (d == "int8") return wide(v.data<int8_t>());
  if (d == "int16") return wide(v.data<int16_t>());
  if (d == "int32") return wide(v.data<int32_t>());
  if (d == "int64") return wide(v.data<int64_t>());
  if (d == "uint8") return wide(v.data<uint8_t>());
  if (d == "uint16") return wide(v.data<uint16_t>());
  if (d == "uint32") return wide(v.data<uint32_t>());
  if (d == "uint64") return wide(v.data<uint64_t>());
  if (d == "float32") return wide(v.data<float>());
  if (d == "float64") return v.data<double>();
  return wide(v.to_float32());
}

std::string shown(double v) {
  std::ostringstream out;
  out.precision(17);
  out << v;
  return out.str();
}

void compare(const std::map<std::string, Values>& outputs, const std::string& name, const Values& want,
             double rtol, double atol) {
  auto found = outputs.find(name);
  if (found == outputs.end()) throw Failure(name + ": not among the outputs");
  const Values& got = found->second;
  if (got.dtype() != want.dtype() || got.shape() != want.shape()) {
    throw Failure(name + ": " + got.dtype() + listed(got.shape()) + ", not " + want.dtype() + listed(want.shape()));
  }
  bool exact = rtol == 0 && atol == 0;
  bool is_float = want.dtype() == "float32" || want.dtype() == "float64";
  if (want.dtype() == "int64" || want.dtype() == "uint64" || (exact && !is_float)) {
    if (got.bytes() != want.bytes()) throw Failure(name + ": other values than " + want.dtype() + " expected");
    return;
  }
  std::vector<double> a = flat(got), b = flat(want);
  for (size_t i = 0; i < b.size(); i++) {
    bool both_nan = std::isnan(a[i]) && std::isnan(b[i]);
    bool ok = exact ? (both_nan || std::memcmp(&a[i], &b[i], sizeof(double)) == 0)  // (-0 is not 0)
                    : (both_nan || a[i] == b[i] || std::fabs(a[i] - b[i]) <= atol + rtol * std::fabs(b[i]));
    if (!ok) throw Failure(name + "[" + std::to_string(i) + "]: " + shown(a[i]) + ", not " + shown(b[i]));
  }
}

void compare_all(const std::map<std::string, Values>& outputs, const json& expected, double rtol, double atol) {
  for (const auto& [name, want] : expected.items()) compare(outputs, name, values(want), rtol, atol);
}

void refused(const std::exception_ptr& thrown, const json& want) {
  std::string kind = want["kind"];
  if (!thrown) throw Failure("not refused as " + kind);
  try {
    std::rethrow_exception(thrown);
  } catch (const deepx::Error& err) {
    std::string said = err.what();
    if (err.kind() != kind) throw Failure("the kind: " + err.kind() + ", not " + kind + " (" + said + ")");
    if (want.contains("message") && said != want["message"].get<std::string>()) {
      throw Failure("the message: " + json(said).dump() + ", not " + want["message"].dump());
    }
    if (want.contains("contains") && said.find(want["contains"].get<std::string>()) == std::string::npos) {
      throw Failure("the message: " + json(said).dump() + " has no " + want["contains"].dump());
    }
  }
}

deepx::Inputs inputs_of(const json& given) {
  deepx::Inputs out;
  for (const auto& [name, t] : given.items()) out[name] = values(t);
  return out;
}

void run_case(const json& c, deepx::Client& client) {
  std::exception_ptr thrown;
  std::optional<deepx::Graph> g;
  try {
    g.emplace(built(c));
    g->spec();
  } catch (const deepx::Error&) {
    thrown = std::current_exception();
  }
  bool at_build = c.contains("error") && c["error"]["at"] == "build";
  if (at_build) return refused(thrown, c["error"]);
  if (thrown) std::rethrow_exception(thrown);
  same_spec(*g, c["spec"]);
  std::optional<deepx::Operation> done;
  try {
    done = client.execute(*g, inputs_of(c["inputs"]));
  } catch (const deepx::Error&) {
    thrown = std::current_exception();
  }
  if (c.contains("error")) return refused(thrown, c["error"]);
  if (thrown) std::rethrow_exception(thrown);
  if (done->state != "succeeded") throw Failure(done->state + ": " + done->error);
  compare_all(done->outputs, c["expected"], c["rtol"], c["atol"]);
}

deepx::Graph graph_of(const json& call) {
  deepx::Graph g = built(call["graph"]);
  same_spec(g, call["graph"]["spec"]);
  return g;
}

void execute(const json& call, deepx::Client& client) {
  deepx::Graph g = graph_of(call);
  deepx::Inputs inputs = inputs_of(call["inputs"]);
  double rtol = call["rtol"], atol = call["atol"];
  if (!call.value("follow", false)) {
    deepx::Operation done = client.execute(g, inputs);
    if (done.state != "succeeded") throw Failure(done.state + ": " + done.error);
    return compare_all(done.outputs, call["expected"], rtol, atol);
  }
  deepx::Operation done = client.start(g, inputs);
  while (done.state == "running") done = client.operation(done.id, 1.0);
  if (done.state != "succeeded") throw Failure(done.state + ": " + done.error);
  if (!done.progress || done.progress->tasks_total == 0 || done.progress->tasks_done != done.progress->tasks_total) {
    throw Failure("progress " + done.fields.value("progress", json()).dump());
  }
  std::string link = "/run?id=" + done.run_id;
  if (done.dashboard.size() < link.size() || done.dashboard.compare(done.dashboard.size() - link.size(), link.size(), link) != 0) {
    throw Failure("dashboard " + json(done.dashboard).dump());
  }
  json run = client.run(done.run_id);
  if (run.value("status", "") != "succeeded") throw Failure("its run: " + run.value("status", json()).dump());
  bool listed = false;
  for (const auto& r : client.runs("", 100)) listed = listed || r.value("id", "") == done.run_id;
  if (!listed) throw Failure("the run " + done.run_id + " is not listed");
  compare_all(done.outputs, call["expected"], rtol, atol);
}

void make_call(const json& call, deepx::Client& client) {
  std::string what = call["do"];
  if (what == "define_asset") {
    client.define_asset(call["asset"], graph_of(call));
  } else if (what == "materialize") {
    deepx::Operation done = client.materialize(call["asset"]);
    if (done.state != call["state"]) throw Failure(call["asset"].get<std::string>() + ": " + done.state + " (" + done.error + ")");
  } else if (what == "read_asset") {
    std::map<std::string, Values> got = {{call["asset"], client.read_asset(call["asset"])}};
    compare(got, call["asset"], values(call["expected"]), call["rtol"], call["atol"]);
  } else if (what == "list_assets") {
    json assets = client.assets();
    for (const auto& name : call["includes"]) {
      bool found = std::any_of(assets.begin(), assets.end(), [&](const json& a) { return a.value("name", "") == name; });
      if (!found) throw Failure(name.get<std::string>() + " is not listed");
    }
  } else if (what == "asset_versions") {
    json versions = client.asset_versions(call["asset"]);
    if (versions.size() < call["at_least"].get<size_t>()) {
      throw Failure(std::to_string(versions.size()) + " versions of " + call["asset"].get<std::string>());
    }
  } else if (what == "execute") {
    execute(call, client);
  } else if (what == "infer") {
    std::exception_ptr thrown;
    std::optional<deepx::Operation> done;
    try {
      done = client.infer(call["model"], inputs_of(call["inputs"]));
    } catch (const deepx::Error&) {
      thrown = std::current_exception();
    }
    if (call.contains("error")) return refused(thrown, call["error"]);
    if (thrown) std::rethrow_exception(thrown);
    compare_all(done->outputs, call["expected"], call["rtol"], call["atol"]);
  } else if (what == "check_server") {
    if (call["protocol_version"] != deepx::kProtocolVersion || call["operator_table_hash"] != deepx::kOperatorTableHash) {
      throw Failure(std::string("this SDK: ") + deepx::kProtocolVersion + " " + deepx::kOperatorTableHash);
    }
    json caps = client.check_server();
    if (caps["operator_table_hash"] != call["operator_table_hash"]) {
      throw Failure("the gateway's hash: " + caps["operator_table_hash"].dump());
    }
  } else if (what == "cancel") {
    deepx::Operation started = client.start(graph_of(call), inputs_of(call["inputs"]));
    if (started.state != "running") throw Failure("started: " + started.state);
    deepx::Operation done = client.cancel(started.id);
    if (done.state != "interrupted" || done.error.find("cancelled") == std::string::npos) {
      throw Failure("cancelled: " + done.state + " (" + done.error + ")");
    }
    json run = client.run(done.run_id);
    if (run.value("status", "") != "interrupted") throw Failure("its run: " + run.value("status", json()).dump());
  } else if (what == "analyze") {
    json answer = client.analyze(graph_of(call));
    for (const char* side : {"inputs", "outputs"}) {
      if (answer.value(side, json()) != call["analysis"][side]) {
        throw Failure(std::string("the ") + side + ": " + answer.value(side, json()).dump() + ", not " +
                      call["analysis"][side].dump());
      }
    }
    if (!answer.value("plan", json()).is_string() || answer["plan"].get<std::string>().empty()) {
      throw Failure("no plan");
    }
    if (!answer.value("tasks", json()).is_number() || answer["tasks"].get<double>() < 1) {
      throw Failure("tasks " + answer.value("tasks", json()).dump());
    }
  } else if (what == "cancel_ended") {
    deepx::Operation done = client.execute(graph_of(call), inputs_of(call["inputs"]));
    if (done.state != "succeeded") throw Failure(done.state + ": " + done.error);
    deepx::Operation cancelled = client.cancel(done.id);  // (it had ended: nothing changes)
    if (cancelled.state != "succeeded" || !cancelled.outputs.empty()) {
      throw Failure("cancelled after its end: " + cancelled.state + " with " +
                    std::to_string(cancelled.outputs.size()) + " outputs");
    }
    deepx::Operation again = client.operation(done.id);
    for (const auto& [name, want] : done.outputs) compare(again.outputs, name, want, 0, 0);
  } else {
    throw Failure("no such call");
  }
}

void run_scenario(const json& c, deepx::Client& client) {
  int i = 0;
  for (const auto& call : c["scenario"]) {
    i++;
    try {
      make_call(call, client);
    } catch (const std::exception& err) {
      throw Failure("call " + std::to_string(i) + " (" + call["do"].get<std::string>() + "): " + err.what());
    }
  }
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

// Every file over one transport: the number that failed.
int run_all(const std::vector<std::filesystem::path>& files, const std::string& transport, const std::string& url) {
  deepx::Client client(url);
  int passed = 0, failed = 0;
  for (const auto& file : files) {
    try {
      std::ifstream in(file);
      std::stringstream text;
      text << in.rdbuf();
      // (this runner's assets, on a gateway others use too)
      json c = json::parse(replaced(text.str(), "{prefix}", "cpp_" + transport + "_"));
      if (c.contains("scenario")) {
        run_scenario(c, client);
      } else {
        run_case(c, client);
      }
      passed++;
    } catch (const std::exception& err) {
      failed++;
      std::cout << "FAILED " << file.filename().string() << " (" << transport << "): " << err.what() << std::endl;
    }
  }
  std::cout << "cpp " << transport << ": " << passed << " passed, " << failed << " failed" << std::endl;
  return failed;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::filesystem::path> files;
  for (int i = 1; i < argc; i++) {
    std::vector<std::filesystem::path> found;
    for (const auto& entry : std::filesystem::directory_iterator(argv[i])) {
      if (entry.path().extension() == ".json") found.push_back(entry.path());
    }
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  const char* url = std::getenv("DEEPX_URL");
  const char* grpc = std::getenv("DEEPX_GRPC");
  if (!url || !*url) {
    std::cout << "cpp http: not run (DEEPX_URL names no gateway)" << std::endl;
    return 1;
  }
  int failed = run_all(files, "http", url);
  if (grpc && *grpc) {
    failed += run_all(files, "grpc", std::string("grpc://") + grpc);
  } else {
    std::cout << "cpp grpc: not run (DEEPX_GRPC names no gateway)" << std::endl;
    failed++;
  }
  return failed > 0 ? 1 : 0;
}
