-- Building graphs: the canonical spec, and mistakes refused where they are made, in Python's
-- words (as the Go and JavaScript SDKs give them).
local deepx = require("deepx")
local json = deepx.json

-- (the spec compared as JSON trees: an integer is not a float, an array not an object)
local function same(a, b)
  if type(a) ~= type(b) then return false end
  if type(a) == "number" then return math.type(a) == math.type(b) and a == b end
  if type(a) ~= "table" then return a == b end
  if getmetatable(a) ~= getmetatable(b) then return false end
  for k, v in pairs(a) do if not same(v, b[k]) then return false end end
  for k in pairs(b) do if a[k] == nil then return false end end
  return true
end

describe("a graph", function()
  it("is built by the operators' methods into the canonical spec", function()
    local g = deepx.graph()
    local x = g:input("x", { 2, 3 })
    local y = g:relu(g:add(x, 1.5))
    local s = g:sum(y, { axes = { 1 }, keepdims = true, id = "total" })
    g:output(s):output(g:argmax(x, { axis = -1 }), "label")
    assert.are.equal('{"deepx":1,"inputs":{"x":{"shape":[2,3],"dtype":"float32"}},"nodes":[' ..
      '{"id":"add_0","op":"add","args":["x",1.5]},{"id":"relu_1","op":"relu","args":["add_0"]},' ..
      '{"id":"total","op":"sum","args":["relu_1"],"attrs":{"axes":[1],"keepdims":true}},' ..
      '{"id":"argmax_3","op":"argmax","args":["x"],"attrs":{"axis":-1}}],' ..
      '"outputs":["total",{"label":"argmax_3"}]}', g:spec_json())
    local want = json.decode('{"deepx": 1, "inputs": {"x": {"shape": [2, 3], "dtype": "float32"}},' ..
      '"nodes": [{"id": "add_0", "op": "add", "args": ["x", 1.5]}, {"id": "relu_1", "op": "relu",' ..
      '"args": ["add_0"]}, {"id": "total", "op": "sum", "args": ["relu_1"], "attrs": {"axes": [1],' ..
      '"keepdims": true}}, {"id": "argmax_3", "op": "argmax", "args": ["x"], "attrs": {"axis": -1}}],' ..
      '"outputs": ["total", {"label": "argmax_3"}]}')
    assert.is_true(same(g:spec(), want))
  end)

  it("writes an integer as an integer and a float as a float, int64 exactly", function()
    local g = deepx.graph()
    local x = g:input("x", { 2 }, "int64")
    g:output(g:add(x, (1 << 62) + 1, { id = "y" }))
    g:output(g:full({ shape = { 2 }, dtype = "float64", value = 2.0 }), "two")
    g:output(g:random_normal({ shape = { 1 }, dtype = "float32", seed = (1 << 60) + 1 }), "r")
    local nodes = g:spec_json():match('"nodes":(%b[])')
    assert.are.equal('[{"id":"y","op":"add","args":["x",4611686018427387905]},' ..
      '{"id":"full_1","op":"full","args":[],"shape":[2],"dtype":"float64","attrs":{"value":2.0}},' ..
      '{"id":"random_normal_2","op":"random_normal","args":[],"shape":[1],"dtype":"float32",' ..
      '"attrs":{"seed":1152921504606846977}}]', nodes)
    assert.are.equal(math.type(g:spec().nodes[2].attrs.value), "float")
  end)

  it("leaves optional inputs out with nil, and takes a list for a variadic operator", function()
    local g = deepx.graph()
    local x = g:input("x", { 4, 5 })
    g:output(g:layer_norm(x, nil, nil, { eps = 0.001 }), "n")
    g:output(g:concat({ x, x }, { axis = 1 }), "c"):output(g:concat(x, x, x), "d")
    g:output(g:op("clip", { x }, { lo = 0, hi = 1 }), "k")
    local spec = g:spec()
    assert.are.same({ "x" }, { table.unpack(spec.nodes[1].args) })
    assert.are.equal(0.001, spec.nodes[1].attrs.eps)
    assert.are.equal(2, #spec.nodes[2].args)
    assert.are.equal(3, #spec.nodes[3].args)
    assert.are.equal("clip", spec.nodes[4].op)
  end)

  it("lets a node state its shape, and ids made do not take a name given", function()
    local g = deepx.graph()
    local x = g:input("x", { 2, 3 })
    g:relu(x, { id = "relu_1" })
    local y = g:relu(x, { shape = { 2, 3 } })
    assert.are.equal("relu_2", y.id)
    g:output(y)
    assert.is_true(same(json.array({ 2, 3 }), g:spec().nodes[2].shape))
  end)

  it("has a method for every operator of the table but input", function()
    local count = 0
    for name in pairs(deepx.OPERATORS) do
      if name ~= "input" then
        assert.is_function(rawget(deepx.Graph, name), name)
        count = count + 1
      end
    end
    assert.is_true(count > 90)
  end)

  local mistakes = {
    { function(g, x) g:op("relux", { x }) end,
      "node 'relux_0': unknown operator 'relux' (did you mean 'relu'?) (see docs/graph-spec.md or `deepx-flow ops` for the list)" },
    { function(g, x) g:op("add", { x }) end, "node 'add_0': add takes 2 input(s), got 1" },
    { function(g, x) g:add(x) end, "node 'add_0': add takes 2 input(s), got 1" },
    { function(g, x) g:sum(x, { axis = 1 }) end,
      "node 'sum_0': sum has no attribute 'axis' (allowed: axes, keepdims); did you mean 'axes'?" },
    { function(g, x) g:one_hot(x, {}) end, "node 'one_hot_0': one_hot needs attribute 'classes'" },
    { function(g, x) g:leaky_relu(x, x) end,
      "node 'leaky_relu_0': leaky_relu takes 1 input(s) (x), got 2" },
    { function(g, x) g:layer_norm() end,
      "node 'layer_norm_0': layer_norm takes 1 to 3 input(s) (x, scale?, bias?), got 0" },
    { function(g) g:concat({}) end, "node 'concat_0': concat needs at least one input" },
    { function(g) g:full({ shape = { 1 }, dtype = "float32" }) end,
      "node 'full_0': full needs attribute 'value'" },
    { function(g) g:full({ dtype = "float32", value = 1 }) end,
      "node 'full_0': full needs a declared shape" },
    { function(g, x) g:leaky_relu(x, { alpha = math.huge }) end,
      "node 'leaky_relu_0': attribute 'alpha' is +Inf, not a value a spec holds (a finite number, a string, a bool, nil, or a list of them)" },
    { function(g, x) g:layer_norm(x, nil, x) end,
      "node 'layer_norm_0': layer_norm: input 3 is given after one left out (nil); only the last inputs may be left out" },
    { function(g) g:relu(deepx.graph():input("y", { 1 })) end,
      "an operand of 'relu_0' is not a tensor of this graph" },
    { function(g, x) g:add(x, 0 / 0) end, "node 'add_0': an operand is NaN, not a finite number" },
    { function(g, x) g:add(x, "x") end,
      "node 'add_0': an operand is a string, not a tensor of this graph or a number" },
    { function(g) g:input("x", { 1 }) end, "node 'x': this id is taken by another input or node" },
    { function(g, x) g:relu(x, { id = "x" }) end, "node 'x': this id is taken by another input or node" },
    { function(g) g:input("z", { 1 }, "float8") end, "node 'z': unknown dtype 'float8' (did you mean 'float64'?)" },
    { function(g) g:input("z", { 2, -1 }) end,
      "node 'z': shape must be a list of non-negative integers, got [2, -1]" },
    { function(g, x) g:reshape(x, { shape = { 1.5 } }) end,
      "node 'reshape_0': shape must be a list of non-negative integers, got [1.5]" },
    { function(g, x) g:output(x):output(x) end, "output 'x' is named twice" },
    { function(g) g:output({}) end, "an output is not a tensor of this graph" },
  }
  for i, case in ipairs(mistakes) do
    it("refuses mistake " .. i .. " where it is made, in Python's words", function()
      local g = deepx.graph()
      local x = g:input("x", { 2, 3 })
      local ok, err = pcall(case[1], g, x)
      assert.is_false(ok)
      assert.is_true(deepx.is_error(err), tostring(err))
      assert.are.equal("GraphError", err.kind)
      assert.are.equal(case[2], tostring(err))
      -- (the graph is as it was: the mistake made no node)
      g:output(g:relu(x), "ok")
      assert.are.equal(1, #g:spec().nodes)
    end)
  end

  it("has no spec without outputs", function()
    local ok, err = pcall(deepx.graph().spec_json, deepx.graph())
    assert.is_false(ok)
    assert.are.equal("the graph has no outputs: name at least one (graph:output)", tostring(err))
  end)

  it("spells 'did you mean' as Python's difflib", function()
    local choices = { "relu", "gelu", "exp", "sum", "mean" }
    assert.are.equal("relu", deepx.closest("relux", choices))
    assert.are.equal("sum", deepx.closest("Sum", choices))
    assert.is_nil(deepx.closest("zzz", choices))
    -- (ties: the largest word, as difflib.get_close_matches orders them)
    assert.are.equal("relu", deepx.closest("xelu", { "gelu", "relu" }))
  end)
end)
