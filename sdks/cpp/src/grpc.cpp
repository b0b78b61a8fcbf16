// The contract over gRPC (deepx.v1's GraphService and CatalogService): tensors as raw
// little-endian bytes, those past the message limit as a header marked `streamed` and then
// TensorChunk messages; the gateway's error kind from the trailing metadata deepx-error-kind.
// A served model's infer is the Open Inference Protocol's GRPCInferenceService.ModelInfer.
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/client_unary_call.h>

#include <chrono>

#include "deepx/client.hpp"
#include "deepx/v1/catalog.grpc.pb.h"
#include "deepx/v1/graphs.grpc.pb.h"
#include "inference/grpc_service.pb.h"
#include "wire.hpp"

namespace deepx::detail {

namespace {

using nlohmann::json;
namespace v1 = ::deepx::v1;

// The gateway's limits (docs/contract.md): 4 MiB a message, of which the tensors' bytes
// (together) leave 64 KiB for the other fields; a streamed tensor's chunks are at most 1 MiB.
constexpr size_t kMaxInlineBytes = (4u << 20) - (64u << 10);
constexpr size_t kChunkBytes = 1u << 20;

int http_status_of(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::INVALID_ARGUMENT: return 400;
    case grpc::StatusCode::UNAUTHENTICATED: return 401;
    case grpc::StatusCode::NOT_FOUND: return 404;
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return 413;
    case grpc::StatusCode::INTERNAL: return 500;
    default: return 0;
  }
}

std::string kind_of_code(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::INVALID_ARGUMENT: return "InputError";
    case grpc::StatusCode::UNAUTHENTICATED: return "Unauthenticated";
    case grpc::StatusCode::NOT_FOUND: return "NotFound";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "TooLarge";
    case grpc::StatusCode::INTERNAL: return "ExecutionError";
    default: return "RemoteError";
  }
}

json field_json(const google::protobuf::Message& message, const google::protobuf::FieldDescriptor* field,
                int index);

// A message as JSON, as the HTTP mirror writes the same answer: the .proto's field names,
// every scalar field (a message or optional field where it is set), 64-bit integers as
// numbers (not protobuf's JSON strings), maps as objects.
json json_of(const google::protobuf::Message& message) {
  using google::protobuf::FieldDescriptor;
  const auto* descriptor = message.GetDescriptor();
  const auto* reflection = message.GetReflection();
  json out = json::object();
  for (int i = 0; i < descriptor->field_count(); i++) {
    const FieldDescriptor* field = descriptor->field(i);
    if (field->is_map()) {
      json entries = json::object();
      for (int k = 0; k < reflection->FieldSize(message, field); k++) {
        const auto& entry = reflection->GetRepeatedMessage(message, field, k);
        json pair = json_of(entry);
        entries[pair["key"].is_string() ? pair["key"].get<std::string>() : pair["key"].dump()] = pair["value"];
      }
      out[field->name()] = entries;
    } else if (field->is_repeated()) {
      json items = json::array();
      for (int k = 0; k < reflection->FieldSize(message, field); k++) {
        items.push_back(field_json(message, field, k));
      }
      out[field->name()] = items;
    } else if (!field->has_presence() || reflection->HasField(message, field)) {
      out[field->name()] = field_json(message, field, -1);
    }
  }
  return out;
}

// One value of a field (index -1: a singular field).
json field_json(const google::protobuf::Message& message, const google::protobuf::FieldDescriptor* field,
                int index) {
  using google::protobuf::FieldDescriptor;
  const auto* r = message.GetReflection();
  bool one = index < 0;
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: return one ? r->GetInt32(message, field) : r->GetRepeatedInt32(message, field, index);
    case FieldDescriptor::CPPTYPE_INT64: return one ? r->GetInt64(message, field) : r->GetRepeatedInt64(message, field, index);
    case FieldDescriptor::CPPTYPE_UINT32: return one ? r->GetUInt32(message, field) : r->GetRepeatedUInt32(message, field, index);
    case FieldDescriptor::CPPTYPE_UINT64: return one ? r->GetUInt64(message, field) : r->GetRepeatedUInt64(message, field, index);
    case FieldDescriptor::CPPTYPE_DOUBLE: return one ? r->GetDouble(message, field) : r->GetRepeatedDouble(message, field, index);
    case FieldDescriptor::CPPTYPE_FLOAT: return one ? r->GetFloat(message, field) : r->GetRepeatedFloat(message, field, index);
    case FieldDescriptor::CPPTYPE_BOOL: return one ? r->GetBool(message, field) : r->GetRepeatedBool(message, field, index);
    case FieldDescriptor::CPPTYPE_ENUM: return (one ? r->GetEnum(message, field) : r->GetRepeatedEnum(message, field, index))->name();
    case FieldDescriptor::CPPTYPE_STRING: return one ? r->GetString(message, field) : r->GetRepeatedString(message, field, index);
    case FieldDescriptor::CPPTYPE_MESSAGE: return json_of(one ? r->GetMessage(message, field) : r->GetRepeatedMessage(message, field, index));
  }
  return nullptr;
}

// A tensor's header, holding its bytes while they fit in room (what is left of one
// message's room for the tensors before it: room shrinks by them), else marked streamed.
void described(v1::Tensor* message, const std::string& name, const Values& values, size_t& room) {
  message->set_name(name);
  message->set_datatype(datatype_of(values.dtype()));
  for (int64_t d : values.shape()) message->add_shape(d);
  if (values.bytes().size() > room) {
    message->set_streamed(true);
  } else {
    message->set_raw_contents(values.bytes().data(), values.bytes().size());
    room -= values.bytes().size();
  }
}

std::vector<int64_t> shape_of(const google::protobuf::RepeatedField<int64_t>& shape) {
  return std::vector<int64_t>(shape.begin(), shape.end());
}

// Values of a tensor message, with the bytes its chunks brought where it was streamed.
Values values_of_message(const v1::Tensor& message, std::string streamed) {
  if (message.has_contents()) {
    throw Error("RemoteError", "tensor " + shown(message.name()) +
                                   " came as typed contents, which this SDK does not read");
  }
  return values_of(message.name(), message.datatype(), shape_of(message.shape()),
                   message.streamed() ? std::move(streamed) : message.raw_contents());
}

std::string list_item(const json& item, const char* field) {
  if (!item.is_string()) throw Error("InputError", std::string(field) + " are strings, not " + item.dump());
  return item.get<std::string>();
}

class Grpc : public Transport {
 public:
  Grpc(std::string address, std::string token) : address_(std::move(address)), token_(std::move(token)) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    channel_ = grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), args);
    graphs_ = v1::GraphService::NewStub(channel_);
    catalog_ = v1::CatalogService::NewStub(channel_);
  }

  json capabilities() override {
    Call call(*this);
    v1::Capabilities answer;
    check(graphs_->GetCapabilities(&call.context, v1::GetCapabilitiesRequest(), &answer), call);
    return json_of(answer);
  }

  json analyze(const json& spec) override {
    Call call(*this);
    v1::AnalyzeGraphRequest request;
    request.set_graph_json(spec.dump());
    v1::AnalyzeGraphResponse answer;
    check(graphs_->AnalyzeGraph(&call.context, request, &answer), call);
    return json_of(answer);
  }

  Operation execute(const json& spec, const Inputs& inputs, const json& options) override {
    Call call(*this, wait_of(options));
    v1::ExecuteGraphRequest first;
    v1::ExecuteGraphHeader* header = first.mutable_header();
    header->set_graph_json(spec.dump());
    std::vector<std::pair<int, const Values*>> streamed;
    size_t room = kMaxInlineBytes;  // (inline while together they fit one message)
    for (const auto& [name, values] : inputs) {
      v1::Tensor* tensor = header->add_inputs();
      described(tensor, name, values, room);
      if (tensor->streamed()) streamed.emplace_back(header->inputs_size() - 1, &values);
    }
    if (options.contains("wait_seconds")) header->set_wait_seconds(options["wait_seconds"].get<double>());
    if (options.contains("operation_id")) header->set_operation_id(options["operation_id"].get<std::string>());
    for (const auto& name : options.value("outputs", json::array())) {
      header->add_outputs()->set_name(list_item(name, "outputs"));
    }
    auto stream = graphs_->ExecuteGraph(&call.context);
    // (a write the gateway refused ends the writing; Finish says why)
    bool open = stream->Write(first);
    for (const auto& [index, values] : streamed) {
      const auto& bytes = values->bytes();
      for (size_t at = 0; open && at < bytes.size(); at += kChunkBytes) {
        v1::ExecuteGraphRequest request;
        v1::TensorChunk* chunk = request.mutable_input_chunk();
        chunk->set_tensor(static_cast<uint32_t>(index));
        chunk->set_offset(at);
        chunk->set_data(bytes.data() + at, std::min(kChunkBytes, bytes.size() - at));
        open = stream->Write(request);
      }
    }
    stream->WritesDone();
    return operation_of(*stream, call);
  }

  Operation operation(const std::string& id, double wait_seconds) override {
    Call call(*this, wait_seconds);
    v1::GetOperationRequest request;
    request.set_id(id);
    if (wait_seconds > 0) request.set_wait_seconds(wait_seconds);
    auto stream = graphs_->GetOperation(&call.context, request);
    return operation_of(*stream, call);
  }

  Operation cancel(const std::string& id) override {
    Call call(*this);
    v1::CancelOperationRequest request;
    request.set_id(id);
    v1::Operation answer;
    check(graphs_->CancelOperation(&call.context, request, &answer), call);
    return fields_of(answer);
  }

  json runs(const std::string& status, int limit) override {
    Call call(*this);
    v1::ListRunsRequest request;
    request.set_status(status);
    request.set_limit(limit > 0 ? static_cast<uint32_t>(limit) : 0);
    v1::ListRunsResponse answer;
    check(catalog_->ListRuns(&call.context, request, &answer), call);
    return json_of(answer)["runs"];
  }

  json run(const std::string& id) override {
    Call call(*this);
    v1::GetRunRequest request;
    request.set_id(id);
    v1::Run answer;
    check(catalog_->GetRun(&call.context, request, &answer), call);
    return json_of(answer);
  }

  json define_asset(const std::string& name, const json& spec, const json& options) override {
    Call call(*this);
    v1::DefineAssetRequest request;
    request.set_name(name);
    request.set_graph_json(spec.dump());
    for (const auto& d : options.value("dependencies", json::array())) {
      request.add_dependencies(list_item(d, "dependencies"));
    }
    for (const auto& p : options.value("partitions", json::array())) {
      request.add_partitions(list_item(p, "partitions"));
    }
    if (options.contains("description")) request.set_description(options["description"].get<std::string>());
    if (options.contains("partition_axis")) request.set_partition_axis(options["partition_axis"].get<uint32_t>());
    for (const auto& given : options.value("checks", json::array())) {
      v1::AssetCheck* check = request.add_checks();
      check->set_kind(given.value("kind", ""));
      if (given.contains("low")) check->set_low(given["low"].get<double>());
      if (given.contains("high")) check->set_high(given["high"].get<double>());
      if (given.contains("blocking")) check->set_blocking(given["blocking"].get<bool>());
      for (const auto& d : given.value("shape", json::array())) check->add_shape(d.get<int64_t>());
    }
    v1::Asset answer;
    this->check(catalog_->DefineAsset(&call.context, request, &answer), call);
    return json_of(answer);
  }

  json assets() override {
    Call call(*this);
    v1::ListAssetsResponse answer;
    check(catalog_->ListAssets(&call.context, v1::ListAssetsRequest(), &answer), call);
    return json_of(answer)["assets"];
  }

  json asset_versions(const std::string& name) override {
    Call call(*this);
    v1::ListAssetVersionsRequest request;
    request.set_name(name);
    v1::ListAssetVersionsResponse answer;
    check(catalog_->ListAssetVersions(&call.context, request, &answer), call);
    return json_of(answer)["versions"];
  }

  Operation materialize(const std::string& name, const json& options) override {
    Call call(*this, wait_of(options));
    v1::MaterializeAssetRequest request;
    request.set_name(name);
    for (const auto& p : options.value("partitions", json::array())) {
      request.add_partitions(list_item(p, "partitions"));
    }
    request.set_force(options.value("force", false));
    request.set_upstream(options.value("upstream", false));
    if (options.contains("wait_seconds")) request.set_wait_seconds(options["wait_seconds"].get<double>());
    if (options.contains("operation_id")) request.set_operation_id(options["operation_id"].get<std::string>());
    auto stream = catalog_->MaterializeAsset(&call.context, request);
    return operation_of(*stream, call);
  }

  Values read_asset(const std::string& name, const json& options) override {
    Call call(*this);
    v1::ReadAssetRequest request;
    request.mutable_asset()->set_name(name);
    request.mutable_asset()->set_version(options.value("version", ""));
    request.mutable_asset()->set_partition(options.value("partition", ""));
    for (const auto& range : options.value("slice", json::array())) {
      v1::Range* r = request.add_slice();
      r->set_start(range.at(0).get<int64_t>());
      r->set_stop(range.at(1).get<int64_t>());
    }
    auto stream = catalog_->ReadAsset(&call.context, request);
    v1::ReadAssetResponse message;
    v1::Tensor header;
    std::string streamed;
    bool first = true;
    while (stream->Read(&message)) {
      if (first) {
        header = message.tensor();
        first = false;
      } else {
        add_chunk(streamed, message.chunk(), 0);
      }
    }
    check(stream->Finish(), call);
    if (first) throw Error("RemoteError", "the gateway's answer has no tensor " + shown(name));
    return values_of_message(header, std::move(streamed));
  }

  Operation infer(const std::string& model, const Inputs& inputs) override {
    Call call(*this);
    ::deepx::inference::ModelInferRequest request;
    request.set_model_name(model);
    for (const auto& [name, values] : inputs) {
      auto* tensor = request.add_inputs();
      tensor->set_name(name);
      tensor->set_datatype(datatype_of(values.dtype()));
      for (int64_t d : values.shape()) tensor->add_shape(d);
      request.add_raw_input_contents(values.bytes().data(), values.bytes().size());
    }
    // The protocol's service is inference.GRPCInferenceService, while the .proto's package
    // is deepx.inference (so that Python can hold both): the call is made by the protocol's
    // name, as the generated stub would make it by its own.
    static const char* const kModelInfer = "/inference.GRPCInferenceService/ModelInfer";
    grpc::internal::RpcMethod method(kModelInfer, grpc::internal::RpcMethod::NORMAL_RPC, channel_);
    ::deepx::inference::ModelInferResponse answer;
    check(grpc::internal::BlockingUnaryCall<::deepx::inference::ModelInferRequest,
                                            ::deepx::inference::ModelInferResponse,
                                            grpc::protobuf::MessageLite, grpc::protobuf::MessageLite>(
              channel_.get(), method, &call.context, request, &answer),
          call);
    if (answer.raw_output_contents_size() != answer.outputs_size()) {
      throw Error("RemoteError", "the gateway's answer has " + std::to_string(answer.outputs_size()) +
                                     " outputs and " + std::to_string(answer.raw_output_contents_size()) +
                                     " raw contents");
    }
    Operation op;
    op.fields = {{"model_name", answer.model_name()}, {"model_version", answer.model_version()},
                 {"id", answer.id()}};
    op.id = answer.id();
    for (int i = 0; i < answer.outputs_size(); i++) {
      const auto& out = answer.outputs(i);
      op.outputs[out.name()] = values_of(out.name(), out.datatype(), shape_of(out.shape()),
                                         answer.raw_output_contents(i));
    }
    return op;
  }

 private:
  // A call's context: the token, and a deadline as HTTP's timeout (wait_seconds: how long
  // the gateway is asked to wait for an operation's end).
  struct Call {
    explicit Call(const Grpc& to, double wait_seconds = 0) : seconds(exchange_seconds(wait_seconds)) {
      if (!to.token_.empty()) context.AddMetadata("authorization", "Bearer " + to.token_);
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
    }
    double seconds;
    grpc::ClientContext context;
  };

  // An Error with the gateway's kind (its trailing metadata) where status is not OK.
  void check(const grpc::Status& status, Call& call) const {
    if (status.ok()) return;
    std::string kind = kind_of_code(status.error_code());
    const auto& trailing = call.context.GetServerTrailingMetadata();
    auto found = trailing.find("deepx-error-kind");
    if (found != trailing.end()) kind.assign(found->second.data(), found->second.size());
    std::string message = status.error_message();
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
      message = "cannot reach the gateway at " + address_ + ": " + message;
    } else if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      message = "the gateway at " + address_ + " did not answer within " + json(call.seconds).dump() +
                " s (the call's deadline passed): " + message;
    }
    throw Error(kind, message, http_status_of(status.error_code()));
  }

  static void add_chunk(std::string& into, const v1::TensorChunk& chunk, size_t tensor) {
    if (chunk.tensor() != tensor || chunk.offset() != into.size()) {
      throw Error("RemoteError", "a chunk of tensor " + std::to_string(chunk.tensor()) + " at byte " +
                                     std::to_string(chunk.offset()) + " came out of order");
    }
    into += chunk.data();
  }

  // The operation of an ExecuteGraph-like answer: the operation, then the chunks of its
  // streamed outputs, in order.
  template <class Stream>
  Operation operation_of(Stream& stream, Call& call) {
    v1::ExecuteGraphResponse message;
    v1::Operation head;
    std::map<size_t, std::string> streamed;
    bool first = true;
    while (stream.Read(&message)) {
      if (first) {
        head = message.operation();
        first = false;
        continue;
      }
      const v1::TensorChunk& chunk = message.output_chunk();
      add_chunk(streamed[chunk.tensor()], chunk, chunk.tensor());
    }
    check(stream.Finish(), call);
    if (first) throw Error("RemoteError", "the gateway's answer has no operation");
    Operation op = fields_of(head);
    for (int i = 0; i < head.outputs_size(); i++) {
      const v1::Tensor& out = head.outputs(i);
      op.outputs[out.name()] = values_of_message(out, std::move(streamed[static_cast<size_t>(i)]));
    }
    return op;
  }

  // An operation's fields as the HTTP mirror names them (its id as "operation").
  static Operation fields_of(v1::Operation head) {
    head.clear_outputs();
    json fields = json_of(head);
    fields["operation"] = fields["id"];
    fields.erase("id");
    if (head.error().empty()) fields.erase("error");  // (as HTTP: no error, no field)
    return operation_of_fields(std::move(fields));
  }

  std::string address_, token_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::GraphService::Stub> graphs_;
  std::unique_ptr<v1::CatalogService::Stub> catalog_;
};

}  // namespace

std::shared_ptr<Transport> grpc_transport(const std::string& address, const std::string& token) {
  return std::make_shared<Grpc>(address, token);
}

}  // namespace deepx::detail
