// What both transports share: reading the gateway's JSON, and a tensor from its
// description (name, datatype, shape) and raw bytes.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "deepx/values.hpp"

namespace deepx::detail {

// The JSON of an answer (RemoteError where it is none).
nlohmann::json parsed(const std::string& text);

// How long one exchange may take before the transport gives up: 10 minutes, or a minute
// more than the gateway is asked to wait for an operation (a wait of the caller's).
inline double exchange_seconds(double wait_seconds) {
  return wait_seconds + 60 > 600 ? wait_seconds + 60 : 600;
}

// The wait_seconds of a call's options (0 where none).
inline double wait_of(const nlohmann::json& options) {
  return options.is_object() && options.contains("wait_seconds") && options["wait_seconds"].is_number()
             ? options["wait_seconds"].get<double>()
             : 0;
}

// Values of a tensor described as the Open Inference Protocol does, from its raw bytes.
Values values_of(const nlohmann::json& entry, const char* bytes, size_t size);
Values values_of(const std::string& name, const std::string& datatype,
                 const std::vector<int64_t>& shape, std::string bytes);

}  // namespace deepx::detail
