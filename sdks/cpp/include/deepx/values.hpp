// A tensor's values with its shape and dtype, as they cross the wire: the Open Inference
// Protocol's raw little-endian bytes, so that every dtype crosses exactly (int64 and uint64
// included). Each dtype holds values of one C++ type:
//
//   bool bool, int8 int8_t, int16 int16_t, int32 int32_t, int64 int64_t, uint8 uint8_t,
//   uint16 uint16_t, uint32 uint32_t, uint64 uint64_t, float32 float, float64 double,
//   float16 and bfloat16 uint16_t (their 16-bit patterns; to_float32() converts)
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "deepx/error.hpp"

namespace deepx {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "values are kept as the wire's little-endian bytes, read in place");

// Every dtype a graph may use, in the spec's spelling.
const std::vector<std::string>& dtypes();

// The Open Inference Protocol's datatype of a dtype (float32 -> FP32), and back; "" where
// there is none.
std::string datatype_of(const std::string& dtype);
std::string dtype_of(const std::string& datatype);

// The bytes of one value of dtype (0 where it is no dtype).
size_t item_size(const std::string& dtype);

// The dtype whose values are of C++ type T by default (uint16_t: uint16, not a 16-bit float).
template <class T>
const char* dtype_for() {
  if constexpr (std::is_same_v<T, bool>) return "bool";
  else if constexpr (std::is_same_v<T, int8_t>) return "int8";
  else if constexpr (std::is_same_v<T, int16_t>) return "int16";
  else if constexpr (std::is_same_v<T, int32_t>) return "int32";
  else if constexpr (std::is_same_v<T, int64_t>) return "int64";
  else if constexpr (std::is_same_v<T, uint8_t>) return "uint8";
  else if constexpr (std::is_same_v<T, uint16_t>) return "uint16";
  else if constexpr (std::is_same_v<T, uint32_t>) return "uint32";
  else if constexpr (std::is_same_v<T, uint64_t>) return "uint64";
  else if constexpr (std::is_same_v<T, float>) return "float32";
  else if constexpr (std::is_same_v<T, double>) return "float64";
  else static_assert(sizeof(T) == 0, "no dtype holds values of this type");
}

class Values {
 public:
  Values() = default;
  // Values of dtype and shape in their raw little-endian bytes (InputError where their
  // number is not the shape's).
  Values(std::string dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes);
  // Values of shape holding data (row-major), of dtype (by default the one of T): a type
  // other than the dtype's, or a number of values other than the shape's, is an InputError.
  template <class T>
  Values(const std::vector<int64_t>& shape, const std::vector<T>& data, std::string dtype = dtype_for<T>())
      : Values(std::move(dtype), shape, raw_of(data, shape)) {
    check_type(dtype_for<T>());
  }

  const std::string& dtype() const noexcept { return dtype_; }
  const std::vector<int64_t>& shape() const noexcept { return shape_; }
  // The number of values.
  size_t size() const noexcept;
  // The raw little-endian bytes, row-major.
  const std::vector<uint8_t>& bytes() const noexcept { return bytes_; }

  // The values as T, the dtype's C++ type (InputError for another type).
  template <class T>
  std::vector<T> data() const {
    check_type(dtype_for<T>());
    std::vector<T> out(size());
    if constexpr (std::is_same_v<T, bool>) {
      for (size_t i = 0; i < out.size(); i++) out[i] = bytes_[i] != 0;
    } else if (!out.empty()) {
      std::memcpy(out.data(), bytes_.data(), bytes_.size());
    }
    return out;
  }

  // The values of a float16 or bfloat16 tensor as float32 (InputError for other dtypes).
  std::vector<float> to_float32() const;

 private:
  template <class T>
  static std::vector<uint8_t> raw_of(const std::vector<T>& data, const std::vector<int64_t>& shape) {
    check_count(data.size(), shape);
    std::vector<uint8_t> out(data.size() * sizeof(T));
    if constexpr (std::is_same_v<T, bool>) {
      for (size_t i = 0; i < data.size(); i++) out[i] = data[i] ? 1 : 0;
    } else if (!data.empty()) {
      std::memcpy(out.data(), data.data(), out.size());
    }
    return out;
  }
  void check_type(const std::string& type_dtype) const;
  static void check_count(size_t count, const std::vector<int64_t>& shape);

  std::string dtype_;
  std::vector<int64_t> shape_;
  std::vector<uint8_t> bytes_;
};

// One float16 (IEEE half) or bfloat16 pattern as float32, and the pattern of a float32
// (rounded to the nearest, ties to even).
float float16_to_float32(uint16_t bits);
float bfloat16_to_float32(uint16_t bits);
uint16_t float32_to_float16(float value);
uint16_t float32_to_bfloat16(float value);

}  // namespace deepx
