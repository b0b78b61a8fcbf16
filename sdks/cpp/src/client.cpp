// Client: a transport by the URL's scheme, the token; what the transports share.
#include "deepx/client.hpp"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>

#include "table.hpp"
#include "wire.hpp"

namespace deepx {

using nlohmann::json;

Client::Client(const std::string& url, const std::string& token) : url_(url) {
  const std::string grpc = "grpc://";
  if (url.compare(0, grpc.size(), grpc) == 0) {
    transport_ = detail::grpc_transport(url.substr(grpc.size()), token);
  } else if (url.compare(0, 7, "http://") == 0 || url.compare(0, 8, "https://") == 0) {
    transport_ = detail::http_transport(url, token);
  } else {
    throw Error("InputError", "a gateway's URL is http://host:port, https://host:port or "
                              "grpc://host:port, not " + shown(url));
  }
}

json Client::check_server() {
  json caps = capabilities();
  if (caps.value("protocol_version", json()) != kProtocolVersion) {
    const json& said = caps.value("protocol_version", json());
    throw Error("RemoteError", url_ + " speaks " + (said.is_string() ? shown(said.get<std::string>()) : "None") +
                                   ", this SDK " + kProtocolVersion);
  }
  if (caps.value("operator_table_hash", json()) != kOperatorTableHash) {
    std::set<std::string> theirs, ours;
    for (const auto& o : caps.value("operators", json::array())) theirs.insert(o.value("name", ""));
    for (const auto& [name, entry] : detail::operator_table()) ours.insert(name);
    std::string missing, unknown;
    for (const auto& name : ours) {
      if (!theirs.count(name)) missing += (missing.empty() ? "" : ", ") + name;
    }
    for (const auto& name : theirs) {
      if (!ours.count(name)) unknown += (unknown.empty() ? "" : ", ") + name;
    }
    throw Error("RemoteError", url_ + " has another operator table than this SDK: missing " +
                                   (missing.empty() ? "none" : missing) + "; not in this SDK " +
                                   (unknown.empty() ? "none" : unknown) + " (upgrade one side)");
  }
  return caps;
}

std::string Client::default_token() {
  const char* token = std::getenv("DEEPX_GATEWAY_TOKEN");
  return token ? token : "";
}

namespace detail {

Operation operation_of_fields(json fields) {
  Operation op;
  fields.erase("outputs");
  auto text = [&](const char* key) {
    return fields.contains(key) && fields[key].is_string() ? fields[key].get<std::string>() : "";
  };
  op.id = fields.contains("operation") ? text("operation") : text("id");
  op.state = text("state");
  op.run_id = text("run_id");
  op.error = text("error");
  op.dashboard = text("dashboard");
  if (fields.contains("progress") && fields["progress"].is_object()) {
    const json& p = fields["progress"];
    op.progress = Progress{p.value("tasks_done", int64_t{0}), p.value("tasks_total", int64_t{0})};
  }
  op.fields = std::move(fields);
  return op;
}

json parsed(const std::string& text) {
  json out = json::parse(text, nullptr, false);
  if (out.is_discarded()) {
    throw Error("RemoteError", "the gateway's answer is not JSON: " + text.substr(0, 200));
  }
  return out;
}

namespace {

void flattened(const json& data, std::vector<json>& into) {
  if (!data.is_array()) {
    into.push_back(data);
    return;
  }
  for (const auto& item : data) flattened(item, into);
}

double number_of(const json& v) {
  if (v.is_string()) {
    std::string s = v.get<std::string>();
    if (s == "NaN") return NAN;
    if (s == "Infinity") return INFINITY;
    if (s == "-Infinity") return -INFINITY;
  }
  if (v.is_boolean()) return v.get<bool>() ? 1 : 0;
  if (!v.is_number()) throw Error("RemoteError", "a tensor's value is " + v.dump() + ", not a number");
  return v.get<double>();
}

template <class T>
std::vector<uint8_t> raw_of(const std::vector<json>& values, T (*convert)(const json&)) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  for (size_t i = 0; i < values.size(); i++) {
    T v = convert(values[i]);
    std::memcpy(out.data() + i * sizeof(T), &v, sizeof(T));
  }
  return out;
}

template <class T>
T integer_of(const json& v) {
  return v.is_boolean() ? static_cast<T>(v.get<bool>()) : v.get<T>();
}

}  // namespace

Values values_of_json(const json& entry) {
  std::string name = entry.value("name", ""), datatype = entry.value("datatype", "");
  std::string dtype = dtype_of(datatype);
  if (dtype.empty()) {
    throw Error("RemoteError", "output " + shown(name) + ": the gateway sent datatype " + shown(datatype));
  }
  std::vector<int64_t> shape;
  for (const auto& d : entry.value("shape", json::array())) shape.push_back(d.get<int64_t>());
  std::vector<json> flat;
  flattened(entry.value("data", json::array()), flat);
  std::vector<uint8_t> raw;
  if (dtype == "bool") raw = raw_of<uint8_t>(flat, [](const json& v) { return static_cast<uint8_t>(number_of(v) != 0); });
  else if (dtype == "int8") raw = raw_of<int8_t>(flat, integer_of<int8_t>);
  else if (dtype == "int16") raw = raw_of<int16_t>(flat, integer_of<int16_t>);
  else if (dtype == "int32") raw = raw_of<int32_t>(flat, integer_of<int32_t>);
  else if (dtype == "int64") raw = raw_of<int64_t>(flat, integer_of<int64_t>);
  else if (dtype == "uint8") raw = raw_of<uint8_t>(flat, integer_of<uint8_t>);
  else if (dtype == "uint16") raw = raw_of<uint16_t>(flat, integer_of<uint16_t>);
  else if (dtype == "uint32") raw = raw_of<uint32_t>(flat, integer_of<uint32_t>);
  else if (dtype == "uint64") raw = raw_of<uint64_t>(flat, integer_of<uint64_t>);
  else if (dtype == "float16") raw = raw_of<uint16_t>(flat, [](const json& v) { return float32_to_float16(static_cast<float>(number_of(v))); });
  else if (dtype == "bfloat16") raw = raw_of<uint16_t>(flat, [](const json& v) { return float32_to_bfloat16(static_cast<float>(number_of(v))); });
  else if (dtype == "float32") raw = raw_of<float>(flat, [](const json& v) { return static_cast<float>(number_of(v)); });
  else raw = raw_of<double>(flat, number_of);
  try {
    return Values(dtype, shape, std::move(raw));
  } catch (const Error& err) {
    throw Error("RemoteError", "output " + shown(name) + ": " + err.message());
  }
}

Values values_of(const json& entry, const char* bytes, size_t size) {
  std::vector<int64_t> shape;
  for (const auto& d : entry.value("shape", json::array())) shape.push_back(d.get<int64_t>());
  return values_of(entry.value("name", ""), entry.value("datatype", ""), shape,
                   std::string(bytes, size));
}

Values values_of(const std::string& name, const std::string& datatype,
                 const std::vector<int64_t>& shape, std::string bytes) {
  std::string dtype = dtype_of(datatype);
  if (dtype.empty()) {
    throw Error("RemoteError", "output " + shown(name) + ": the gateway sent datatype " + shown(datatype));
  }
  try {
    return Values(dtype, shape, std::vector<uint8_t>(bytes.begin(), bytes.end()));
  } catch (const Error& err) {
    throw Error("RemoteError", "output " + shown(name) + ": " + err.message());
  }
}

}  // namespace detail

}  // namespace deepx
