// Client: a transport by the URL's scheme, the token; what the transports share.
#include "deepx/client.hpp"

#include <cstdlib>
#include <random>
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

namespace {

// An operation id of the client's own: 32 random lower-case hex digits.
std::string new_operation_id() {
  thread_local std::mt19937_64 random{std::random_device{}() ^
                                      (static_cast<uint64_t>(std::random_device{}()) << 32)};
  static const char digits[] = "0123456789abcdef";
  std::string id;
  for (int half = 0; half < 2; half++) {
    uint64_t bits = random();
    for (int i = 0; i < 16; i++, bits >>= 4) id += digits[bits & 15];
  }
  return id;
}

bool given(const json& options, const char* key) {
  return options.contains(key) && !options[key].is_null();
}

}  // namespace

json Client::waiting(const json& options, bool& follow) const {
  json out = options.is_object() ? options : json::object();
  if (!given(out, "operation_id")) out["operation_id"] = new_operation_id();
  follow = !given(out, "wait_seconds");  // (a wait of the caller's: their start-and-follow)
  if (follow) out["wait_seconds"] = wait_slice_;
  return out;
}

Operation Client::followed(Operation op, const std::string& id) {
  // (a run longer than one exchange's wait is asked for again by its id, never run twice)
  while (op.state == "running") op = transport_->operation(op.id.empty() ? id : op.id, wait_slice_);
  return op;
}

Operation Client::execute(const json& spec, const Inputs& inputs, const json& options) {
  bool follow = false;
  json sent = waiting(options, follow);
  Operation op = transport_->execute(spec, inputs, sent);
  return follow ? followed(std::move(op), sent["operation_id"].get<std::string>()) : op;
}

Operation Client::materialize(const std::string& name, const json& options) {
  bool follow = false;
  json sent = waiting(options, follow);
  Operation op = transport_->materialize(name, sent);
  return follow ? followed(std::move(op), sent["operation_id"].get<std::string>()) : op;
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
