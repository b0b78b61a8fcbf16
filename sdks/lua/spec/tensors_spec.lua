-- Tensors as binary data: every dtype crosses exactly, a value a dtype cannot hold is
-- refused, 16-bit floats convert to float32.
local deepx = require("deepx")
local tensors = require("deepx.tensors")

local function round_trip(data, dtype)
  local t = deepx.tensor(data, { #data }, dtype)
  local raw = tensors.raw(t)
  return tensors.from_raw(deepx.WIRE[dtype], { #data }, raw, 1, #raw), raw
end

describe("tensors", function()
  it("cross as little-endian bytes exactly, in every dtype", function()
    local cases = {
      int8 = { -128, 127, 0 }, int16 = { -32768, 32767 }, int32 = { -2147483648, 2147483647 },
      int64 = { math.mininteger, math.maxinteger, (1 << 62) + 3 }, uint8 = { 0, 255 },
      uint16 = { 0, 65535 }, uint32 = { 0, 4294967295 }, uint64 = { 0, 1, -1, math.mininteger },
      float16 = { 0x3c00, 0xfc00 }, bfloat16 = { 0x3f80, 0x7fc0 },
      float32 = { 1.5, -0.0, math.huge, 3.4028234663852886e38 }, float64 = { 0.1, -0.0, -math.huge },
      bool = { true, false },
    }
    for dtype, data in pairs(cases) do
      local back = round_trip(data, dtype)
      assert.are.equal(dtype, back.dtype)
      for i, v in ipairs(data) do
        assert.are.equal(v, back.data[i], dtype)
        if v == 0 and math.type(v) == "float" then assert.are.equal(1 / v, 1 / back.data[i]) end
      end
    end
    local back, raw = round_trip({ 1, 2 }, "int64")
    assert.are.equal(string.pack("<i8<i8", 1, 2), raw)
    assert.are.equal("integer", math.type(back.data[1])) -- (never a float: no rounding)
  end)

  it("takes int64 and uint64 as decimal strings too, uint64 as the integer with its bits", function()
    local back = round_trip({ "18446744073709551615", "9223372036854775808", 2.0 ^ 63 }, "uint64")
    assert.are.same({ -1, math.mininteger, math.mininteger }, back.data)
    assert.are.equal("18446744073709551615", deepx.uint64_tostring(back.data[1]))
    assert.are.equal("9223372036854775808", deepx.uint64_tostring(math.mininteger))
    assert.are.equal("12345", deepx.uint64_tostring(12345))
    assert.are.equal(-2, deepx.uint64_fromstring("18446744073709551614"))
    assert.is_nil(deepx.uint64_fromstring("18446744073709551616"))
    assert.are.same({ math.mininteger }, round_trip({ "-9223372036854775808" }, "int64").data)
  end)

  it("refuses a value its dtype cannot hold, rather than round or wrap it", function()
    local refusals = {
      { { 1.5 }, "int32", "1.5 is not a int32 value" },
      { { 300 }, "int8", "300 is not a int8 value" },
      { { -1 }, "uint32", "-1 is not a uint32 value" },
      { { "9223372036854775808" }, "int64", "'9223372036854775808' is not a int64 value" },
      { { "18446744073709551616" }, "uint64", "'18446744073709551616' is not a uint64 value" },
      { { 2.0 ^ 64 }, "uint64", "1.8446744073709552e+19 is not a uint64 value" },
      { { 1e39 }, "float32", "1e+39 is beyond float32's range" },
      { { 2 }, "bool", "2 is not a bool value" },
      { { 70000 }, "float16", "70000 is not a float16 value" },
      { { "1" }, "float64", "'1' is not a float64 value" },
    }
    for _, case in ipairs(refusals) do
      local ok, err = pcall(tensors.raw, deepx.tensor(case[1], { 1 }, case[2]))
      assert.is_false(ok)
      assert.are.equal("InputError", err.kind)
      assert.are.equal(case[3], tostring(err))
    end
    local ok, err = pcall(deepx.tensor, { 1, 2 }, { 3 })
    assert.is_false(ok)
    assert.are.equal("2 values, but shape [3] holds 3", tostring(err))
    ok, err = pcall(deepx.tensor, { 1 }, { 1 }, "float8")
    assert.are.equal("unknown dtype 'float8'", tostring(err))
  end)

  it("converts float16 and bfloat16 patterns to float32", function()
    assert.are.same({ 1, -2, 2.0 ^ -24, -0.0, math.huge },
      deepx.to_float32({ dtype = "float16", data = { 0x3c00, 0xc000, 0x0001, 0x8000, 0x7c00 } }))
    assert.are.same({ 1, 3.140625 }, deepx.to_float32({ dtype = "bfloat16", data = { 0x3f80, 0x4049 } }))
    local nan = deepx.to_float32({ dtype = "float16", data = { 0x7e00 } })[1]
    assert.is_true(nan ~= nan)
    local ok, err = pcall(deepx.to_float32, { dtype = "int8", data = {} })
    assert.are.equal("int8 is not a 16-bit float", tostring(err))
    -- (anything else it cannot convert is an InputError too, never a raw Lua error)
    for _, bad in ipairs({
      { { dtype = "float16", data = { 1.5 } }, "1.5 is not a float16 value" },
      { { dtype = "bfloat16", data = { 0x10000 } }, "65536 is not a bfloat16 value" },
      { { dtype = "float16", data = { -1 } }, "-1 is not a float16 value" },
      { { dtype = "float16", data = { "0x3c00" } }, "'0x3c00' is not a float16 value" },
      { { dtype = "float16" }, "a tensor's data is a list of values, not None" },
      { 7, "a tensor is a table, not 7" },
    }) do
      ok, err = pcall(deepx.to_float32, bad[1])
      assert.is_false(ok)
      assert.is_true(deepx.is_error(err), tostring(err))
      assert.are.equal("InputError", err.kind)
      assert.are.equal(bad[2], tostring(err))
    end
  end)

  it("are read in bulk: a million float32 values", function()
    local data = {}
    for i = 1, 1000000 do data[i] = i * 0.5 end
    local back = round_trip(data, "float32")
    assert.are.equal(1000000, #back.data)
    assert.are.equal(500000.0, back.data[1000000])
  end)
end)
