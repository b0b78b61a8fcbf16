// What both transports share: reading the gateway's JSON, and a tensor from its
// description (name, datatype, shape) and raw bytes.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "deepx/values.hpp"

namespace deepx::detail {

// The JSON of an answer (RemoteError where it is none).
nlohmann::json parsed(const std::string& text);

// Values of a tensor as the Open Inference Protocol's JSON holds it ("data").
Values values_of_json(const nlohmann::json& entry);

// Values of a tensor described as the Open Inference Protocol does, from its raw bytes.
Values values_of(const nlohmann::json& entry, const char* bytes, size_t size);
Values values_of(const std::string& name, const std::string& datatype,
                 const std::vector<int64_t>& shape, std::string bytes);

}  // namespace deepx::detail
