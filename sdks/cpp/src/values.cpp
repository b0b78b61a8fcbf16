// Values: dtypes, their wire names and sizes, checked construction, 16-bit floats.
#include "deepx/values.hpp"

#include <cmath>
#include <map>

namespace deepx {

namespace {

struct Kind {
  const char* datatype;
  size_t size;
  const char* holds;  // the dtype whose C++ type holds its values
};

const std::map<std::string, Kind>& kinds() {
  static const std::map<std::string, Kind> table = {
      {"bool", {"BOOL", 1, "bool"}},          {"int8", {"INT8", 1, "int8"}},
      {"int16", {"INT16", 2, "int16"}},       {"int32", {"INT32", 4, "int32"}},
      {"int64", {"INT64", 8, "int64"}},       {"uint8", {"UINT8", 1, "uint8"}},
      {"uint16", {"UINT16", 2, "uint16"}},    {"uint32", {"UINT32", 4, "uint32"}},
      {"uint64", {"UINT64", 8, "uint64"}},    {"float16", {"FP16", 2, "uint16"}},
      {"bfloat16", {"BF16", 2, "uint16"}},    {"float32", {"FP32", 4, "float32"}},
      {"float64", {"FP64", 8, "float64"}}};
  return table;
}

std::string listed(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); i++) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

}  // namespace

const std::vector<std::string>& dtypes() {
  static const std::vector<std::string> names = {
      "bool",   "int8",    "int16",    "int32",   "int64",  "uint8",  "uint16",
      "uint32", "uint64",  "float16",  "bfloat16", "float32", "float64"};
  return names;
}

std::string datatype_of(const std::string& dtype) {
  auto found = kinds().find(dtype);
  return found == kinds().end() ? "" : found->second.datatype;
}

std::string dtype_of(const std::string& datatype) {
  for (const auto& [dtype, kind] : kinds()) {
    if (datatype == kind.datatype) return dtype;
  }
  return "";
}

size_t item_size(const std::string& dtype) {
  auto found = kinds().find(dtype);
  return found == kinds().end() ? 0 : found->second.size;
}

Values::Values(std::string dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes)
    : dtype_(std::move(dtype)), shape_(std::move(shape)), bytes_(std::move(bytes)) {
  if (item_size(dtype_) == 0) {
    throw Error("InputError", "unknown dtype " + shown(dtype_) + did_you_mean(dtype_, dtypes()));
  }
  for (int64_t d : shape_) {
    if (d < 0) throw Error("InputError", "a shape is non-negative integers, not " + listed(shape_));
  }
  if (bytes_.size() != size() * item_size(dtype_)) {
    throw Error("InputError", std::to_string(bytes_.size()) + " bytes, but a " + dtype_ +
                                  " tensor of shape " + listed(shape_) + " is " +
                                  std::to_string(size() * item_size(dtype_)));
  }
}

void Values::check_count(size_t count, const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= d < 0 ? 0 : static_cast<size_t>(d);
  if (count != n) {
    throw Error("InputError", std::to_string(count) + " values, but shape " + listed(shape) +
                                  " holds " + std::to_string(n));
  }
}

size_t Values::size() const noexcept {
  size_t n = 1;
  for (int64_t d : shape_) n *= static_cast<size_t>(d);
  return n;
}

void Values::check_type(const std::string& type_dtype) const {
  std::string holds = kinds().at(dtype_).holds;
  if (holds != type_dtype) {
    throw Error("InputError", "dtype " + dtype_ + " holds the values of " + holds + ", not of " +
                                  type_dtype);
  }
}

float float16_to_float32(uint16_t bits) {
  double sign = bits & 0x8000 ? -1 : 1;
  int exponent = (bits >> 10) & 0x1f;
  double fraction = bits & 0x3ff;
  if (exponent == 0) return static_cast<float>(sign * std::ldexp(fraction / 1024, -14));
  if (exponent == 31) return fraction != 0 ? NAN : static_cast<float>(sign * INFINITY);
  return static_cast<float>(sign * std::ldexp(1 + fraction / 1024, exponent - 15));
}

float bfloat16_to_float32(uint16_t bits) {
  uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, sizeof out);
  return out;
}

uint16_t float32_to_bfloat16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | 0x40);  // (stays NaN)
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

uint16_t float32_to_float16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  if (std::isnan(value)) return sign | 0x7e00;
  float magnitude = std::fabs(value);
  if (magnitude >= 65520.0f) return sign | 0x7c00;  // (rounds past the largest: infinity)
  if (magnitude < std::ldexp(1.0f, -14)) {  // subnormal: units of 2**-24, ties to even
    return sign | static_cast<uint16_t>(std::nearbyint(std::ldexp(magnitude, 24)));
  }
  uint32_t mantissa = bits & 0x7fffff;
  int exponent = static_cast<int>((bits >> 23) & 0xff) - 127 + 15;
  uint32_t half = (static_cast<uint32_t>(exponent) << 10) | (mantissa >> 13);
  uint32_t rest = mantissa & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) half++;  // (a carry moves the exponent)
  return sign | static_cast<uint16_t>(half);
}

std::vector<float> Values::to_float32() const {
  if (dtype_ != "float16" && dtype_ != "bfloat16") {
    throw Error("InputError", dtype_ + " is not a 16-bit float");
  }
  std::vector<uint16_t> bits = data<uint16_t>();
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); i++) {
    out[i] = dtype_ == "bfloat16" ? bfloat16_to_float32(bits[i]) : float16_to_float32(bits[i]);
  }
  return out;
}

}  // namespace deepx
