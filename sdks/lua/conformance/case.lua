-- A conformance case (sdks/conformance/make_cases.py): its graph built through the SDK's
-- public API by calling the method named by each step, compared with the stored spec; then
-- run on the gateway, its outputs compared with the stored ones. The scenarios' calls
-- (scenario.lua) use the same pieces.

local deepx = require("deepx")
local json = deepx.json

local function fail(format, ...) error({ conformance = string.format(format, ...) }, 0) end

-- The case's graph, made by calling the method named by each step.
local function built(c)
  local g = deepx.graph()
  local tensors = {}
  for _, step in ipairs(c.steps) do
    if step.input then
      tensors[step.input] = g:input(step.input, step.shape, step.dtype)
    else
      local args = {}
      for i, a in ipairs(step.args) do args[i] = type(a) == "string" and tensors[a] or a end
      local options = { id = step.id, shape = step.shape, dtype = step.dtype }
      for k, v in pairs(step.attrs) do options[k] = v end
      local method = rawget(deepx.Graph, step.op)
      if deepx.OPERATORS[step.op] and type(method) == "function" then
        args[#args + 1] = options
        tensors[step.id] = method(g, table.unpack(args, 1, #step.args + 1))
      else -- (the generic op for a name the table lacks)
        tensors[step.id] = g:op(step.op, args, options)
      end
    end
  end
  for _, o in ipairs(c.outputs) do g:output(tensors[o[2]], o[1]) end
  return g
end

-- Whether two values read from JSON are the same: an integer is not a float, an array not
-- an object.
local function same(a, b)
  if type(a) ~= type(b) then return false end
  if type(a) == "number" then return math.type(a) == math.type(b) and a == b end
  if type(a) ~= "table" then return a == b end
  if getmetatable(a) ~= getmetatable(b) then return false end
  for k, v in pairs(a) do
    if not same(v, b[k]) then return false end
  end
  for k in pairs(b) do
    if a[k] == nil then return false end
  end
  return true
end

local SPECIAL = { NaN = 0 / 0, Infinity = math.huge, ["-Infinity"] = -math.huge }

-- A case's tensor as the SDK's: int64 and uint64 as decimal strings (the SDK reads them),
-- non-finite floats spelled out, the rest as they are.
local function values(t)
  local data = {}
  if t.pattern then -- (value i is (i mod modulo) * scale: too large a tensor to store)
    local n, modulo, scale = 1, t.pattern.modulo, t.pattern.scale
    for _, d in ipairs(t.shape) do n = n * d end
    for i = 1, n do data[i] = ((i - 1) % modulo) * scale end
    return deepx.tensor(data, t.shape, t.dtype)
  end
  for i, v in ipairs(t.data) do
    if t.dtype == "uint64" then
      data[i] = deepx.uint64_fromstring(v)
    elseif t.dtype == "int64" then
      data[i] = math.tointeger(tonumber(v))
    else
      data[i] = SPECIAL[v] or v
    end
  end
  return deepx.tensor(data, t.shape, t.dtype)
end

local function inputs_of(given)
  local out = {}
  for name, t in pairs(given) do
    -- (int64 and uint64 given as the case writes them: decimal strings the SDK takes)
    out[name] = (t.dtype == "int64" or t.dtype == "uint64") and t.data and
        deepx.tensor(t.data, t.shape, t.dtype) or values(t)
  end
  return out
end

local function bits(v) return string.pack("<d", v) end

local function compare(got, want, rtol, atol, name)
  if got == nil then fail("%s: no such output", name) end
  if got.dtype ~= want.dtype or not same(json.array(got.shape), json.array(want.shape)) then
    fail("%s: %s%s, not %s%s", name, got.dtype, json.encode(got.shape), want.dtype,
      json.encode(want.shape))
  end
  local a, b = got.data, want.data
  if #a ~= #b then fail("%s: %d values, not %d", name, #a, #b) end
  local exact = rtol == 0 and atol == 0 or want.dtype == "int64" or want.dtype == "uint64"
  for i = 1, #b do
    local x, y = a[i], b[i]
    local ok
    if x ~= x and y ~= y then -- (NaN is NaN)
      ok = true
    elseif exact then -- (-0.0 is not 0.0)
      ok = x == y and (math.type(y) ~= "float" or bits(x) == bits(y))
    else
      ok = x == y or (type(y) == "number" and math.abs(x - y) <= atol + rtol * math.abs(y))
    end
    if not ok then fail("%s[%d]: %s, not %s", name, i - 1, tostring(x), tostring(y)) end
  end
end

local function refused(err, want)
  if not deepx.is_error(err) then fail("not refused as %s: %s", want.kind, tostring(err)) end
  if err.kind ~= want.kind then
    fail("the kind: %s, not %s (%s)", err.kind, want.kind, tostring(err))
  end
  if want.message and tostring(err) ~= want.message then
    fail("the message: %q, not %q", tostring(err), want.message)
  end
  if want.contains and not tostring(err):find(want.contains, 1, true) then
    fail("the message: %q has no %q", tostring(err), want.contains)
  end
end

-- The graph of a case (or a scenario's call), which must give the stored spec.
local function graph_of(c)
  local g = built(c)
  if not same(g:spec(), c.spec) then fail("the graph the steps build: %s", g:spec_json()) end
  return g
end

-- Every expected tensor, by name, as the SDK gave it.
local function compare_all(outputs, expected, rtol, atol)
  local names = {}
  for name in pairs(expected) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    compare(outputs[name], values(expected[name]), rtol, atol, name)
  end
end

local function run(c, client)
  local ok, g = pcall(built, c)
  if c.error and c.error.at == "build" then
    if ok then fail("the mistake is not refused as it is made") end
    return refused(g, c.error)
  end
  if not ok then error(g, 0) end
  if not same(g:spec(), c.spec) then fail("the graph the steps build: %s", g:spec_json()) end
  local done
  ok, done = pcall(client.execute, client, g, inputs_of(c.inputs))
  if c.error then
    if ok then fail("the run is not refused") end
    return refused(done, c.error)
  end
  if not ok then error(done, 0) end
  if done.state ~= "succeeded" then fail("%s: %s", done.state, tostring(done.error)) end
  compare_all(done.outputs, c.expected, c.rtol, c.atol)
end

return { fail = fail, graph_of = graph_of, inputs_of = inputs_of, values = values,
  compare = compare, compare_all = compare_all, refused = refused, run = run }

