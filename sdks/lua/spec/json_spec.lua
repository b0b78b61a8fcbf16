-- The SDK's JSON: numbers keep their kind both ways, arrays are told from objects.
local json = require("deepx.json")

describe("json", function()
  it("reads an integer as an integer and a float as a float, int64 exactly", function()
    local t = json.decode('[2, 2.0, -0.0, 1e3, 9223372036854775807, -9223372036854775808, 0.1]')
    assert.are.equal("integer", math.type(t[1]))
    assert.are.equal("float", math.type(t[2]))
    assert.are.equal("-0.0", json.encode(t[3]))
    assert.are.equal("float", math.type(t[4]))
    assert.are.equal(math.maxinteger, t[5])
    assert.are.equal(math.mininteger, t[6])
    assert.are.equal("[2,2.0,-0.0,1000.0,9223372036854775807,-9223372036854775808,0.1]",
      json.encode(t))
  end)

  it("tells arrays from objects, empty ones too, and writes objects' keys sorted", function()
    local t = json.decode('{"b": [], "a": {}, "c": [null, true]}')
    assert.are.equal(json.array_mt, getmetatable(t.b))
    assert.are.equal(json.object_mt, getmetatable(t.a))
    assert.are.equal(json.null, t.c[1])
    assert.are.equal('{"a":{},"b":[],"c":[null,true]}', json.encode(t))
    assert.are.equal('{"args":[],"x":{"z":1}}', json.encode({ x = { z = 1 }, args = {} }))
    assert.are.equal('{"g":{"deepx":1}}', json.encode({ g = json.raw('{"deepx":1}') }))
  end)

  it("writes the shortest float that reads back the same", function()
    assert.are.equal("0.1", json.float(0.1))
    assert.are.equal("3.4028234663852886e+38", json.float(3.4028234663852886e38))
    assert.are.equal("1e+300", json.float(1e300))
    assert.has_error(function() json.encode(0 / 0) end)
  end)

  it("escapes and unescapes strings, \\u escapes and surrogate pairs included", function()
    local text = 'a"b\\c\n\t\1é'
    assert.are.equal('"a\\"b\\\\c\\n\\t\\u0001é"', json.encode(text))
    assert.are.equal(text, json.decode(json.encode(text)))
    assert.are.equal("é😀/", json.decode('"\\u00e9\\ud83d\\ude00\\/"'))
  end)

  it("refuses text that is not JSON", function()
    for _, bad in ipairs({ "[1,", "{1: 2}", "[1] 2", '"open', "nul" }) do
      local ok, err = pcall(json.decode, bad)
      assert.is_false(ok, bad)
      assert.is_true(err.json, bad)
    end
  end)
end)

describe("json's drop_nulls", function()
  it("leaves an object's null fields out, and keeps an array's", function()
    local t = json.decode('{"a": null, "b": [null, 1]}', { drop_nulls = true })
    assert.is_nil(t.a)
    assert.are.equal(json.null, t.b[1])
    assert.are.equal(2, #t.b)
  end)
end)
