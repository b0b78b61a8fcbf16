// The contract over HTTP with libcurl: JSON calls, and tensors as the Open Inference
// Protocol's binary data both ways (the JSON head, then each tensor's raw bytes, the head's
// length in Inference-Header-Content-Length).
#include <curl/curl.h>
#include <strings.h>

#include <cctype>
#include <cstdio>
#include <mutex>
#include <vector>

#include "deepx/client.hpp"
#include "wire.hpp"

namespace deepx::detail {

namespace {

using nlohmann::json;

const char* const kHeaderLength = "Inference-Header-Content-Length";

struct Answer {
  long status = 0;
  std::string body;
  long head_length = -1;  // (the JSON head's length, where binary data follows it)
};

size_t collect(char* data, size_t size, size_t count, void* to) {
  static_cast<std::string*>(to)->append(data, size * count);
  return size * count;
}

size_t header_line(char* data, size_t size, size_t count, void* to) {
  std::string line(data, size * count);
  std::string name = std::string(kHeaderLength) + ":";
  if (line.size() > name.size() && strncasecmp(line.c_str(), name.c_str(), name.size()) == 0) {
    try {
      static_cast<Answer*>(to)->head_length = std::stol(line.substr(name.size()));
    } catch (const std::exception&) {
      static_cast<Answer*>(to)->head_length = -2;  // (refused below)
    }
  }
  return size * count;
}

std::string escaped(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      char hex[4];
      std::snprintf(hex, sizeof hex, "%%%02X", c);
      out += hex;
    }
  }
  return out;
}

// The kind of an error the gateway said without one (the Open Inference Protocol's calls).
std::string kind_of_status(long status) {
  switch (status) {
    case 400: return "InputError";
    case 401: return "Unauthenticated";
    case 404: case 405: return "NotFound";
    case 413: return "TooLarge";
    case 500: return "ExecutionError";
  }
  return "RemoteError";
}

class Http : public Transport {
 public:
  Http(std::string url, std::string token) : url_(std::move(url)), token_(std::move(token)) {
    while (!url_.empty() && url_.back() == '/') url_.pop_back();
    static std::once_flag once;
    std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  }
  ~Http() override {
    for (CURL* handle : idle_) curl_easy_cleanup(handle);
  }

  json capabilities() override { return call_json("GET", "/v1/capabilities"); }

  json analyze(const json& spec) override {
    return call_json("POST", "/v1/graphs:analyze", json{{"graph", spec}});
  }

  Operation execute(const json& spec, const Inputs& inputs, const json& options) override {
    json body = options.is_object() ? options : json::object();
    body["graph"] = spec;
    body["parameters"] = {{"binary_data_output", true}};
    return with_tensors("/v1/graphs:execute", body, inputs, exchange_seconds(wait_of(options)));
  }

  Operation operation(const std::string& id, double wait_seconds) override {
    std::string path = "/v1/operations/" + escaped(id) + "?binary_data_output=true";
    if (wait_seconds > 0) path += "&wait_seconds=" + json(wait_seconds).dump();
    return operation_of(call("GET", path, nullptr, -1, exchange_seconds(wait_seconds)));
  }

  // (the operation without outputs, as the gateway answers a cancel)
  Operation cancel(const std::string& id) override {
    return operation_of(call("POST", "/v1/operations/" + escaped(id) + ":cancel", nullptr, -1));
  }

  json runs(const std::string& status, int limit) override {
    std::string query;
    if (!status.empty()) query += "status=" + escaped(status);
    if (limit > 0) query += std::string(query.empty() ? "" : "&") + "limit=" + std::to_string(limit);
    return call_json("GET", "/v1/runs" + (query.empty() ? "" : "?" + query)).value("runs", json::array());
  }

  json run(const std::string& id) override { return call_json("GET", "/v1/runs/" + escaped(id)); }

  json define_asset(const std::string& name, const json& spec, const json& options) override {
    json body = options.is_object() ? options : json::object();
    body["name"] = name;
    body["graph"] = spec;
    return call_json("POST", "/v1/assets:define", body);
  }

  json assets() override { return call_json("GET", "/v1/assets").value("assets", json::array()); }

  json asset_versions(const std::string& name) override {
    return call_json("GET", "/v1/assets/" + escaped(name) + "/versions")
        .value("versions", json::array());
  }

  Operation materialize(const std::string& name, const json& options) override {
    std::string body = (options.is_object() ? options : json::object()).dump();
    return operation_of(call("POST", "/v1/assets/" + escaped(name) + ":materialize", &body, -1,
                             exchange_seconds(wait_of(options))));
  }

  Values read_asset(const std::string& name, const json& options) override {
    json body = options.is_object() ? options : json::object();
    body["parameters"] = {{"binary_data_output", true}};
    std::string text = body.dump();
    Operation read = operation_of(call("POST", "/v1/assets/" + escaped(name) + ":read", &text, -1));
    auto found = read.outputs.find(name);
    if (found == read.outputs.end()) {
      throw Error("RemoteError", "the gateway's answer has no tensor " + shown(name));
    }
    return found->second;
  }

  Operation infer(const std::string& model, const Inputs& inputs) override {
    json body = {{"parameters", {{"binary_data_output", true}}}};
    return with_tensors("/v2/models/" + escaped(model) + "/infer", body, inputs);
  }

 private:
  Operation with_tensors(const std::string& path, json body, const Inputs& inputs,
                         double timeout = exchange_seconds(0)) {
    json listed = json::array();
    std::string raw;
    for (const auto& [name, values] : inputs) {
      listed.push_back({{"name", name}, {"datatype", datatype_of(values.dtype())},
                        {"shape", values.shape()},
                        {"parameters", {{"binary_data_size", values.bytes().size()}}}});
      raw.append(values.bytes().begin(), values.bytes().end());
    }
    body["inputs"] = listed;
    std::string data = body.dump();
    long head = static_cast<long>(data.size());
    data += raw;
    return operation_of(call("POST", path, &data, head, timeout));
  }

  json call_json(const std::string& method, const std::string& path, const json& body = nullptr) {
    std::string text = body.is_null() ? "" : body.dump();
    Answer answer = call(method, path, body.is_null() ? nullptr : &text, -1);
    return parsed(answer.body);
  }

  // A curl handle of this request's own, while it runs (calls from several threads run at
  // once); handles are kept for the next requests, which reuse their connections.
  class Handle {
   public:
    explicit Handle(Http& http) : http_(http) {
      {
        std::lock_guard<std::mutex> hold(http_.lock_);
        if (!http_.idle_.empty()) {
          curl_ = http_.idle_.back();
          http_.idle_.pop_back();
        }
      }
      if (curl_ == nullptr) curl_ = curl_easy_init();
      if (curl_ == nullptr) throw Error("RemoteError", "libcurl could not make a handle");
      curl_easy_reset(curl_);
    }
    ~Handle() {
      std::lock_guard<std::mutex> hold(http_.lock_);
      http_.idle_.push_back(curl_);
    }
    CURL* get() const { return curl_; }

   private:
    Http& http_;
    CURL* curl_ = nullptr;
  };

  // One request (timeout: seconds it may take in all); an answer of status 400 or more is
  // thrown as the gateway's Error.
  Answer call(const std::string& method, const std::string& path, const std::string* body,
              long head_length, double timeout = exchange_seconds(0)) {
    Handle handle(*this);
    CURL* curl = handle.get();
    Answer answer;
    curl_slist* headers = nullptr;
    headers = curl_slist_append(headers, head_length >= 0 ? "Content-Type: application/octet-stream"
                                                          : "Content-Type: application/json");
    headers = curl_slist_append(headers, "Expect:");  // (no 100-continue round trip)
    std::string length = std::string(kHeaderLength) + ": " + std::to_string(head_length);
    if (head_length >= 0) headers = curl_slist_append(headers, length.c_str());
    std::string bearer = "Authorization: Bearer " + token_;
    if (!token_.empty()) headers = curl_slist_append(headers, bearer.c_str());
    std::string url = url_ + path;
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout * 1000));
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &answer.body);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, header_line);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, &answer);
    if (method == "POST") {
      curl_easy_setopt(curl, CURLOPT_POST, 1L);
      curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE,
                       static_cast<curl_off_t>(body ? body->size() : 0));
      curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body ? body->data() : "");
    }
    CURLcode done = curl_easy_perform(curl);
    curl_slist_free_all(headers);
    if (done == CURLE_OPERATION_TIMEDOUT) {
      throw Error("RemoteError", "the gateway at " + url_ + " did not answer within " +
                                     json(timeout).dump() + " s: " + curl_easy_strerror(done));
    }
    if (done != CURLE_OK) {
      throw Error("RemoteError", "cannot reach the gateway at " + url_ + ": " +
                                     curl_easy_strerror(done));
    }
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &answer.status);
    if (answer.status >= 400) {
      std::string message = answer.body, kind = kind_of_status(answer.status);
      json said = json::parse(answer.body, nullptr, false);
      if (said.is_object() && said.contains("error") && said["error"].is_string()) {
        message = said["error"].get<std::string>();
        if (said.contains("kind") && said["kind"].is_string()) kind = said["kind"].get<std::string>();
      }
      throw Error(kind, message, static_cast<int>(answer.status));
    }
    if (answer.head_length < -1 || answer.head_length > static_cast<long>(answer.body.size())) {
      throw Error("RemoteError", std::string("the gateway sent a bad ") + kHeaderLength);
    }
    return answer;
  }

  Operation operation_of(const Answer& answer) {
    size_t head = answer.head_length >= 0 ? static_cast<size_t>(answer.head_length) : answer.body.size();
    json fields = parsed(answer.body.substr(0, head));
    json listed = fields.value("outputs", json::array());
    Operation op = operation_of_fields(std::move(fields));
    size_t at = head;
    for (const auto& entry : listed) {
      std::string name = entry.value("name", "");
      json size = entry.contains("parameters") ? entry["parameters"].value("binary_data_size", json()) : json();
      if (!size.is_number_unsigned() || at + size.get<size_t>() > answer.body.size()) {
        throw Error("RemoteError", "output " + shown(name) + " came without its binary data");
      }
      op.outputs[name] = values_of(entry, answer.body.data() + at, size.get<size_t>());
      at += size.get<size_t>();
    }
    return op;
  }

  std::string url_, token_;
  std::mutex lock_;          // (guards idle_)
  std::vector<CURL*> idle_;  // handles no request holds now
};

}  // namespace

std::shared_ptr<Transport> http_transport(const std::string& url, const std::string& token) {
  return std::make_shared<Http>(url, token);
}

}  // namespace deepx::detail
