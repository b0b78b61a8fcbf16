// A client of a deepx_flow gateway (deepx-flow serve) over its contract (docs/contract.md),
// over HTTP (libcurl; tensors as the protocol's binary data both ways) or gRPC (deepx.v1's
// services; tensors past the message limit streamed in chunks). The gateway's refusals
// throw deepx::Error with the kind and message Python gives.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "deepx/graph.hpp"
#include "deepx/values.hpp"

namespace deepx {

// Tensors by name: a graph's inputs, a model's inputs.
using Inputs = std::map<std::string, Values>;

// How far an operation's run has got: tasks_done of tasks_total.
struct Progress {
  int64_t tasks_done = 0, tasks_total = 0;
};

// An operation's answer (a graph's execution, an asset's materialization, a model's
// inference): its id, state (running, succeeded, failed, interrupted), run id, error, the
// run's dashboard page, its progress (while it runs, and once it succeeded), its outputs
// once it succeeded, and every field the gateway said but the outputs (fields: as HTTP's
// JSON names them, over gRPC too).
struct Operation {
  std::string id, state, run_id, error, dashboard;
  std::optional<Progress> progress;
  std::map<std::string, Values> outputs;
  nlohmann::json fields;
};

// What a transport does; Client picks one by its URL's scheme.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual nlohmann::json capabilities() = 0;
  virtual nlohmann::json analyze(const nlohmann::json& spec) = 0;
  virtual Operation execute(const nlohmann::json& spec, const Inputs& inputs,
                            const nlohmann::json& options) = 0;
  virtual Operation operation(const std::string& id, double wait_seconds) = 0;
  virtual Operation cancel(const std::string& id) = 0;
  virtual nlohmann::json runs(const std::string& status, int limit) = 0;
  virtual nlohmann::json run(const std::string& id) = 0;
  virtual nlohmann::json define_asset(const std::string& name, const nlohmann::json& spec,
                                      const nlohmann::json& options) = 0;
  virtual nlohmann::json assets() = 0;
  virtual nlohmann::json asset_versions(const std::string& name) = 0;
  virtual Operation materialize(const std::string& name, const nlohmann::json& options) = 0;
  virtual Values read_asset(const std::string& name, const nlohmann::json& options) = 0;
  virtual Operation infer(const std::string& model, const Inputs& inputs) = 0;
};

class Client {
 public:
  // A client of the gateway at url: http://host:port (or https://) for its HTTP port,
  // grpc://host:port for its gRPC port. token: a bearer token, for a gateway that needs one
  // (by default DEEPX_GATEWAY_TOKEN where that is set).
  explicit Client(const std::string& url, const std::string& token = default_token());

  // The gateway's capabilities: protocol version, operators, limits, datatypes.
  nlohmann::json capabilities() { return transport_->capabilities(); }
  // The capabilities, once the gateway is found to speak this SDK's protocol and operator
  // table (kProtocolVersion, kOperatorTableHash; an Error of kind RemoteError saying what
  // differs, otherwise), as Python's dx.connect checks.
  nlohmann::json check_server();
  // The gateway's analysis of a graph: its inputs' and outputs' shapes and dtypes, the plan.
  nlohmann::json analyze(const Graph& graph) { return analyze(graph.spec()); }
  nlohmann::json analyze(const nlohmann::json& spec) { return transport_->analyze(spec); }
  // Runs a graph on inputs and waits for its outputs, however long the run takes: each
  // exchange waits up to wait_slice() for its end, then the operation is asked for again
  // by its id (operation_id: the caller's, or 32 random hex digits of the client's). Options:
  // operation_id; outputs, a list of names; wait_seconds, to answer "running" past it
  // instead (one exchange: follow it with operation()).
  Operation execute(const Graph& graph, const Inputs& inputs = {},
                    const nlohmann::json& options = nlohmann::json::object()) {
    return execute(graph.spec(), inputs, options);
  }
  Operation execute(const nlohmann::json& spec, const Inputs& inputs = {},
                    const nlohmann::json& options = nlohmann::json::object());
  // Starts running a graph on inputs and answers at once: the operation, running (or ended
  // already); follow it with operation().
  Operation start(const Graph& graph, const Inputs& inputs = {}) {
    return execute(graph.spec(), inputs, {{"wait_seconds", 0}});
  }
  // An operation as the gateway has it now, or once it ends within wait_seconds.
  Operation operation(const std::string& id, double wait_seconds = 0) {
    return transport_->operation(id, wait_seconds);
  }
  // Stops a running operation: the operation once it ended.
  Operation cancel(const std::string& id) { return transport_->cancel(id); }
  // The runs the gateway's database records, newest first (status: running, succeeded,
  // failed, interrupted; "" for all; limit 0: the gateway's default).
  nlohmann::json runs(const std::string& status = "", int limit = 0) {
    return transport_->runs(status, limit);
  }
  // One run by id: its status, kind, tasks, workers, times, error.
  nlohmann::json run(const std::string& id) { return transport_->run(id); }
  // Defines (or defines again) asset name computed by graph (one output; each input reads
  // the upstream asset of its name). options: dependencies, description, partitions,
  // partition_axis, checks (as docs/contract.md lists them).
  nlohmann::json define_asset(const std::string& name, const Graph& graph,
                              const nlohmann::json& options = nlohmann::json::object()) {
    return define_asset(name, graph.spec(), options);
  }
  nlohmann::json define_asset(const std::string& name, const nlohmann::json& spec,
                              const nlohmann::json& options = nlohmann::json::object()) {
    return transport_->define_asset(name, spec, options);
  }
  // Every asset defined: name, status, latest version, checks, ...
  nlohmann::json assets() { return transport_->assets(); }
  // The stored versions of asset name, newest first.
  nlohmann::json asset_versions(const std::string& name) { return transport_->asset_versions(name); }
  // Makes a new version of asset name and waits for it as execute() does (options:
  // partitions, force, upstream, operation_id, wait_seconds): the operation, whose
  // fields["materialized"] says what was made and checked.
  Operation materialize(const std::string& name,
                        const nlohmann::json& options = nlohmann::json::object());
  // The newest usable version of asset name (options: version, partition, slice: [[start,
  // stop], ...] per leading axis).
  Values read_asset(const std::string& name,
                    const nlohmann::json& options = nlohmann::json::object()) {
    return transport_->read_asset(name, options);
  }
  // Calls served model on inputs (the Open Inference Protocol's infer).
  Operation infer(const std::string& model, const Inputs& inputs) {
    return transport_->infer(model, inputs);
  }

  // How long one exchange of execute() and materialize() waits for the operation's end
  // before asking again (60 s; each exchange may take 10 minutes, or the caller's
  // wait_seconds and a minute, before the transport gives up).
  double wait_slice() const { return wait_slice_; }
  void set_wait_slice(double seconds) { wait_slice_ = seconds; }

  static std::string default_token();

 private:
  // options with the operation's id and, unless the caller gave one, the wait of one
  // exchange (follow: the operation is then asked for again while it runs).
  nlohmann::json waiting(const nlohmann::json& options, bool& follow) const;
  Operation followed(Operation op, const std::string& id);

  std::string url_;
  std::shared_ptr<Transport> transport_;
  double wait_slice_ = 60;
};

namespace detail {
// An operation from the fields the gateway said (its outputs apart).
Operation operation_of_fields(nlohmann::json fields);
std::shared_ptr<Transport> http_transport(const std::string& url, const std::string& token);
std::shared_ptr<Transport> grpc_transport(const std::string& address, const std::string& token);
}  // namespace detail

}  // namespace deepx
