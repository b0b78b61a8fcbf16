-- Tensors on the wire: the Open Inference Protocol's, sent and received as binary data (the
-- protocol's binary extension), so every dtype crosses exactly. In Lua a tensor is
-- {shape = {...}, dtype = "...", data = {...}}, data a flat list of Lua values, row-major:
--
--   float32, float64      numbers (floats; float32 values are exactly the float32's)
--   int8 ... int32, uint8 ... uint32   integers
--   int64                 integers: Lua's are 64-bit, so every value is exact
--   uint64                integers with the value's 64 bits: past 2^63-1 a value reads as a
--                         negative integer (2^64-1 is -1); deepx.uint64_tostring(v) writes
--                         it in decimal, math.ult compares; given, a decimal string
--                         ("18446744073709551615") is taken too
--   bool                  true and false (0 and 1 are taken too)
--   float16, bfloat16     integers: their 16-bit patterns; deepx.to_float32(t) converts
--
-- A value the dtype cannot hold as given (1.5 as an int32, 300 as an int8, a float past
-- float32's range) is refused with an InputError, never rounded or wrapped.

local errors = require("deepx.errors")

local shown = errors.shown

local M = {}

--- dtype -> the protocol's datatype.
M.WIRE = { bool = "BOOL", int8 = "INT8", int16 = "INT16", int32 = "INT32", int64 = "INT64",
  uint8 = "UINT8", uint16 = "UINT16", uint32 = "UINT32", uint64 = "UINT64", float16 = "FP16",
  bfloat16 = "BF16", float32 = "FP32", float64 = "FP64" }
local DTYPE_OF = {}
for dtype, wire in pairs(M.WIRE) do DTYPE_OF[wire] = dtype end

-- each dtype's string.pack format (little-endian; uint64 as the integer with its bits)
local FORMAT = { bool = "B", int8 = "i1", int16 = "i2", int32 = "i4", int64 = "i8", uint8 = "B",
  uint16 = "I2", uint32 = "I4", uint64 = "i8", float16 = "I2", bfloat16 = "I2", float32 = "f",
  float64 = "d" }
local RANGE = { int8 = { -128, 127 }, int16 = { -32768, 32767 },
  int32 = { -2147483648, 2147483647 }, uint8 = { 0, 255 }, uint16 = { 0, 65535 },
  uint32 = { 0, 4294967295 }, float16 = { 0, 65535 }, bfloat16 = { 0, 65535 },
  int64 = { math.mininteger, math.maxinteger } }
local CHUNK = 4096 -- (values packed or unpacked per string.pack call)

local function input_error(message) errors.raise("InputError", message) end

local function show_shape(shape)
  local parts = {}
  for i, d in ipairs(shape) do parts[i] = tostring(d) end
  return "[" .. table.concat(parts, ", ") .. "]"
end

local function size(shape)
  local n = 1
  for _, d in ipairs(shape) do n = n * d end
  return n
end

--- A tensor of dtype (default float32) and shape (default: 1-D) holding data, a flat list.
function M.tensor(data, shape, dtype)
  dtype = dtype or "float32"
  if not M.WIRE[dtype] then input_error("unknown dtype " .. shown(dtype)) end
  if type(data) ~= "table" then
    input_error("a tensor's data is a list of values, not " .. shown(data))
  end
  local n = data.n or #data
  shape = shape or { n }
  local copy = {}
  if type(shape) == "table" then
    for i = 1, #shape do
      local d = math.type(shape[i]) and math.tointeger(shape[i])
      if not d or d < 0 then copy = nil break end
      copy[i] = d
    end
  end
  if not copy then
    input_error("a shape is a list of non-negative integers, not " .. shown(shape))
  end
  if size(copy) ~= n then
    input_error(string.format("%d values, but shape %s holds %d", n, show_shape(copy), size(copy)))
  end
  return { shape = copy, dtype = dtype, data = data }
end

--- An unsigned 64-bit value (the integer with its bits) in decimal.
function M.uint64_tostring(v)
  if v >= 0 then return string.format("%d", v) end
  local q = (v >> 1) // 5 -- (v / 10 unsigned: >> is a logical shift)
  return string.format("%d%d", q, v - q * 10)
end

-- A decimal string as a 64-bit integer of dtype (int64: its value; uint64: its bits), or nil
-- where it is not one or does not fit.
local function parse_integer(text, dtype)
  if dtype == "int64" then
    local v = text:match("^%s*-?%d+%s*$") and tonumber(text)
    return math.type(v) == "integer" and v or nil
  end
  local digits = text:match("^%s*(%d+)%s*$")
  if not digits then return nil end
  local v, max_by_10 = 0, 1844674407370955161 -- ((2^64 - 1) // 10)
  for i = 1, #digits do
    local d = digits:byte(i) - 48
    if math.ult(max_by_10, v) or (v == max_by_10 and d > 5) then return nil end
    v = v * 10 + d -- (wraps past 2^63: the bits stay right)
  end
  return v
end

--- A decimal string as the integer with the bits of that uint64 value ("18446744073709551615"
-- is -1), or nil where it is not one.
function M.uint64_fromstring(text)
  return parse_integer(text, "uint64")
end

-- value as the integer or number string.pack writes for dtype, or an InputError.
local function exact(value, dtype)
  if dtype == "bool" then
    if value == true or value == 1 then return 1 end
    if value == false or value == 0 then return 0 end
  elseif dtype == "float32" or dtype == "float64" then
    if type(value) == "number" then
      if dtype == "float32" and value == value and math.abs(value) ~= math.huge and
          math.abs(string.unpack("<f", string.pack("<f", value))) == math.huge then
        input_error(shown(value) .. " is beyond float32's range")
      end
      return value
    end
  elseif type(value) == "string" and (dtype == "int64" or dtype == "uint64") then
    local v = parse_integer(value, dtype)
    if v then return v end
  elseif type(value) == "number" then
    if dtype == "uint64" then
      if math.type(value) == "integer" then return value end
      -- (a float: its value where it is an integer in [0, 2^64))
      if value >= 0 and value < 2.0 ^ 64 and math.floor(value) == value then
        return value < 2.0 ^ 63 and math.tointeger(value) or math.tointeger(value - 2.0 ^ 64)
      end
    else
      local v = math.tointeger(value)
      local range = RANGE[dtype]
      if v and v >= range[1] and v <= range[2] then return v end
    end
  end
  input_error(shown(value) .. " is not a " .. dtype .. " value")
end

--- The raw little-endian bytes of a tensor's data.
function M.raw(t)
  local dtype = t.dtype
  local format = FORMAT[dtype]
  if not format then input_error("unknown dtype " .. shown(dtype)) end
  local data = t.data
  local n = size(t.shape)
  if (data.n or #data) ~= n then
    input_error(string.format("%d values, but shape %s holds %d", data.n or #data,
      show_shape(t.shape), n))
  end
  local parts, values = {}, {}
  for at = 1, n, CHUNK do
    local stop = math.min(at + CHUNK - 1, n)
    for i = at, stop do values[i - at + 1] = exact(data[i], dtype) end
    local k = stop - at + 1
    parts[#parts + 1] = string.pack("<" .. format:rep(k), table.unpack(values, 1, k))
  end
  return table.concat(parts)
end

--- A tensor of the protocol's datatype and shape from the raw bytes at [first, last].
function M.from_raw(datatype, shape, bytes, first, last)
  local dtype = DTYPE_OF[datatype]
  if not dtype then
    errors.raise("RemoteError", "the gateway sent datatype " .. shown(datatype))
  end
  local format = FORMAT[dtype]
  local n, width = size(shape), string.packsize(FORMAT[dtype])
  if last - first + 1 ~= n * width then
    errors.raise("RemoteError", string.format("the gateway sent %d bytes for %s%s",
      last - first + 1, dtype, show_shape(shape)))
  end
  local data, at = {}, first
  for start = 1, n, CHUNK do
    local k = math.min(CHUNK, n - start + 1)
    local values = table.pack(string.unpack("<" .. format:rep(k), bytes, at))
    at = values[k + 1]
    table.move(values, 1, k, start, data)
  end
  if dtype == "bool" then
    for i = 1, n do data[i] = data[i] ~= 0 end
  end
  return { shape = shape, dtype = dtype, data = data }
end

--- The values of a float16 or bfloat16 tensor (its 16-bit patterns) as float32 values; an
-- InputError for anything else.
function M.to_float32(t)
  if type(t) ~= "table" then input_error("a tensor is a table, not " .. shown(t)) end
  if t.dtype ~= "float16" and t.dtype ~= "bfloat16" then
    input_error(tostring(t.dtype) .. " is not a 16-bit float")
  end
  if type(t.data) ~= "table" then
    input_error("a tensor's data is a list of values, not " .. shown(t.data))
  end
  local out = {}
  for i = 1, t.data.n or #t.data do
    local bits = math.type(t.data[i]) and math.tointeger(t.data[i])
    if not bits or bits < 0 or bits > 0xffff then
      input_error(shown(t.data[i]) .. " is not a " .. t.dtype .. " value")
    end
    if t.dtype == "bfloat16" then
      out[i] = string.unpack("<f", string.pack("<I4", bits << 16))
    else
      local sign = bits & 0x8000 ~= 0 and -1 or 1
      local exponent, fraction = (bits >> 10) & 0x1f, bits & 0x3ff
      if exponent == 0 then
        out[i] = sign * (fraction / 1024) * 2.0 ^ -14
      elseif exponent == 31 then
        out[i] = fraction ~= 0 and 0 / 0 or sign * math.huge
      else
        out[i] = sign * (1 + fraction / 1024) * 2.0 ^ (exponent - 15)
      end
    end
  end
  return out
end

return M
