-- Building a graph: a Graph holds its nodes in the order they were made, each Tensor is one
-- of them. Operators are checked as they are applied (name, number of inputs, attributes),
-- with Python's messages, and a mistake is raised there as a deepx error (errors.lua);
-- shapes and dtypes are the gateway's to infer (client:analyze). g:spec_json() is the graph
-- spec (docs/graph-spec.md) the gateway reads, written as the Go SDK writes it: node ids are
-- the ids given ({id = "total"}) or <op>_<n> in the order the nodes were made; attributes
-- are those given; literals stay numbers in "args", an integer as an integer and a float as
-- a float (2.0 stays 2.0).

local errors = require("deepx.errors")
local json = require("deepx.json")
local OPERATORS = require("deepx.generated.table")

local shown, graph_error = errors.shown, errors.graph_error

local M = {}

M.DTYPES = { "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
  "uint64", "float16", "bfloat16", "float32", "float64" }
local is_dtype = {}
for _, d in ipairs(M.DTYPES) do is_dtype[d] = true end

--- One node of a graph: an input, or an operator applied to tensors and numbers.
local Tensor = { __name = "deepx.Tensor" }
Tensor.__index = Tensor
M.Tensor = Tensor

function Tensor:__tostring()
  return "<Tensor " .. self.id .. " (" .. self.op .. ")>"
end

local Graph = { __name = "deepx.Graph" }
Graph.__index = Graph
M.Graph = Graph

--- An empty graph.
function M.new()
  return setmetatable({ _inputs = {}, _nodes = {}, _outputs = {}, _ids = {} }, Graph)
end

-- (Go writes +Inf, -Inf and NaN where a number does not cross as JSON)
local function non_finite(v)
  if v ~= v then return "NaN" end
  return v > 0 and "+Inf" or "-Inf"
end

local function is_finite(v)
  return v == v and v ~= math.huge and v ~= -math.huge
end

-- A shape as a list of integers, or the error about it.
local function checked_shape(shape, node)
  local out = {}
  local ok = type(shape) == "table" and getmetatable(shape) ~= Tensor
  if ok then
    for i = 1, #shape do
      local d = math.type(shape[i]) and math.tointeger(shape[i])
      if not d or d < 0 then ok = false break end
      out[i] = d
    end
  end
  if not ok then
    graph_error(node, "shape must be a list of non-negative integers, got %s", shown(shape))
  end
  return json.array(out)
end

local function check_name(name, what)
  if type(name) ~= "string" or name == "" then
    errors.raise("GraphError", what .. " must be a non-empty string, not " .. shown(name))
  end
end

function Graph:_claim(id)
  if self._ids[id] then graph_error(id, "this id is taken by another input or node") end
  self._ids[id] = true
end

--- A named input of shape (a list of integers) and dtype (see deepx.DTYPES; default
-- float32).
function Graph:input(name, shape, dtype)
  dtype = dtype or "float32"
  check_name(name, "an input's name")
  shape = checked_shape(shape, name)
  if not is_dtype[dtype] then
    graph_error(name, "unknown dtype %s%s", shown(dtype),
      errors.did_you_mean(tostring(dtype), M.DTYPES))
  end
  self:_claim(name)
  self._inputs[name] = { shape = shape, dtype = dtype }
  return setmetatable({ graph = self, id = name, op = "input" }, Tensor)
end

-- <op>_<n>, n the node's place; past an id taken by a name given, the next free n.
function Graph:_auto_id(name)
  local n = #self._nodes
  while self._ids[name .. "_" .. n] do n = n + 1 end
  return name .. "_" .. n
end

-- The number of inputs given: inputs.n where set, else the largest index (a nil may be
-- left for an optional input).
local function count(inputs)
  if inputs.n then return inputs.n end
  local n = 0
  for k in pairs(inputs) do
    if math.type(k) == "integer" and k > n then n = k end
  end
  return n
end

local function check_inputs(entry, inputs, n, id)
  local required, variadic = 0, false
  for _, name in ipairs(entry.inputs) do
    if name:sub(-3) == "..." then variadic = true end
    if name:sub(-1) ~= "?" then required = required + 1 end
  end
  local given = 0
  for i = 1, n do
    if inputs[i] ~= nil then
      if given < i - 1 then -- (a nil before it: the operands would shift into its place)
        graph_error(id, "%s: input %d is given after one left out (nil); only the last " ..
          "inputs may be left out", entry.name, i)
      end
      given = given + 1
    end
  end
  local listed = table.concat(entry.inputs, ", ")
  if variadic then
    if given < 1 then graph_error(id, "%s needs at least one input", entry.name) end
  elseif entry.kind == "composite" and required ~= #entry.inputs then
    if given < required or given > #entry.inputs then
      graph_error(id, "%s takes %d to %d input(s) (%s), got %d", entry.name, required,
        #entry.inputs, listed, given)
    end
  elseif given ~= #entry.inputs then
    graph_error(id, "%s takes %d input(s)%s, got %d", entry.name, #entry.inputs,
      entry.kind == "composite" and " (" .. listed .. ")" or "", given)
  end
  return given
end

-- What is wrong with an attribute's value, or nil; the value as the spec holds it (a list
-- copied, so that changing the caller's table later changes nothing here).
local function checked_value(value, depth)
  local kind = type(value)
  if kind == "boolean" or kind == "string" or value == json.null then return nil, value end
  if kind == "number" then
    if math.type(value) == "float" and not is_finite(value) then return non_finite(value) end
    return nil, value
  end
  local mt = getmetatable(value)
  if kind == "table" and (mt == nil or mt == json.array_mt) and depth < 32 then
    local n, out = 0, json.array()
    for _ in pairs(value) do n = n + 1 end
    if n == #value then
      for i = 1, n do
        local problem, v = checked_value(value[i], depth + 1)
        if problem then return problem end
        out[i] = v
      end
      return nil, out
    end
  end
  return kind == "table" and "a table that is not a list" or "a " .. kind
end

local function check_attrs(entry, given, id)
  local keys = {}
  for key in pairs(given) do keys[#keys + 1] = key end
  -- (the first unknown one named, whatever the table's order)
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  local attrs = {}
  for _, key in ipairs(keys) do
    local value = given[key]
    if not entry.attrs[key] then
      local close = errors.closest(tostring(key), entry.attr_order)
      graph_error(id, "%s has no attribute %s (allowed: %s)%s", entry.name, shown(key),
        #entry.attr_order > 0 and table.concat(entry.attr_order, ", ") or "none",
        close and ("; did you mean " .. shown(close) .. "?") or "")
    end
    if value ~= json.null then
      local problem, v = checked_value(value, 0)
      if problem then
        graph_error(id, "attribute %s is %s, not a value a spec holds (a finite number, a " ..
          "string, a bool, nil, or a list of them)", shown(key), problem)
      end
      attrs[key] = v
    end
  end
  for _, key in ipairs(entry.attr_order) do
    if entry.attrs[key].required and attrs[key] == nil then
      graph_error(id, "%s needs attribute %s", entry.name, shown(key))
    end
  end
  return attrs
end

function Graph:_arg(operand, id)
  if getmetatable(operand) == Tensor then
    if operand.graph ~= self then
      errors.raise("GraphError", "an operand of " .. shown(id) .. " is not a tensor of this graph")
    end
    return operand.id
  end
  local kind = type(operand)
  if kind == "boolean" or math.type(operand) == "integer" then return operand end
  if kind == "number" then
    if not is_finite(operand) then
      graph_error(id, "an operand is %s, not a finite number", non_finite(operand))
    end
    return operand
  end
  graph_error(id, "an operand is a %s, not a tensor of this graph or a number", kind)
end

--- Any operator by name: inputs is a list of tensors of this graph and numbers (nil for an
-- optional input left out: set inputs.n, or leave it last); options holds its attributes by
-- name, and id (the node's id), shape and dtype (what a node that states them states).
-- Every operator of the table also has a method of its own (generated/operators.lua).
function Graph:op(name, inputs, options)
  local given = {}
  for k, v in pairs(options or {}) do given[k] = v end
  local id = self:_auto_id(tostring(name))
  if given.id ~= nil then
    if type(given.id) ~= "string" or given.id == "" then
      graph_error(id, "an id is a non-empty string, not %s", shown(given.id))
    end
    id = given.id
  end
  given.id = nil
  local entry = OPERATORS[name]
  if entry == nil or name == "input" then
    local names = {}
    for n in pairs(OPERATORS) do
      if n ~= "input" then names[#names + 1] = n end
    end
    table.sort(names)
    graph_error(id, "unknown operator %s%s (see docs/graph-spec.md or `deepx-flow ops` for " ..
      "the list)", shown(name), errors.did_you_mean(tostring(name), names))
  end
  if type(inputs) ~= "table" or getmetatable(inputs) == Tensor then
    graph_error(id, "%s's inputs must be a list", name)
  end
  local n = count(inputs)
  check_inputs(entry, inputs, n, id)
  local node = { id = id, op = name }
  -- (a node may state its shape or dtype: the gateway checks it against its rule)
  for _, field in ipairs({ "shape", "dtype" }) do
    local value = given[field]
    given[field] = nil
    if value == nil or value == json.null then
      if entry.states[field] and entry.states[field].required then
        graph_error(id, "%s needs a declared %s", name, field)
      end
    elseif field == "shape" then
      node.shape = checked_shape(value, id)
    else
      if not is_dtype[value] then
        graph_error(id, "unknown dtype %s%s", shown(value),
          errors.did_you_mean(tostring(value), M.DTYPES))
      end
      node.dtype = value
    end
  end
  local attrs = check_attrs(entry, given, id)
  local args = json.array()
  for i = 1, n do
    if inputs[i] ~= nil then args[#args + 1] = self:_arg(inputs[i], id) end
  end
  node.args = args
  if next(attrs) ~= nil then node.attrs = attrs end
  self:_claim(id)
  self._nodes[#self._nodes + 1] = node
  return setmetatable({ graph = self, id = id, op = name }, Tensor)
end

-- (the operands given to an operator's method, and the options table that may end them:
-- a table that is neither a tensor nor a list)
local function is_options(v)
  return type(v) == "table" and getmetatable(v) ~= Tensor and v[1] == nil
end

--- The operator's method's call (generated/operators.lua): g:add(a, b), g:sum(x, {axes =
-- {1}}), g:concat({t0, t1}, {axis = 1}) or g:concat(t0, t1, {axis = 1}).
function Graph:_call(name, ...)
  local n = select("#", ...)
  local args = table.pack(...)
  local options = {}
  if n > 0 and is_options(args[n]) then
    options = args[n]
    args[n] = nil
    n = n - 1
  end
  local entry = OPERATORS[name]
  local list = args[1]
  if entry and entry.variadic and n == 1 and type(list) == "table" and
      getmetatable(list) ~= Tensor then
    args, n = list, count(list)
  end
  return self:op(name, table.move(args, 1, n, 1, { n = n }), options)
end

--- Name tensor as an output of the graph (by default, its id); the graph, to chain calls.
function Graph:output(tensor, name)
  if getmetatable(tensor) ~= Tensor or tensor.graph ~= self then
    errors.raise("GraphError", "an output is not a tensor of this graph")
  end
  if name == nil then name = tensor.id end
  check_name(name, "an output's name")
  for _, o in ipairs(self._outputs) do
    if o[1] == name then errors.raise("GraphError", "output " .. shown(name) .. " is named twice") end
  end
  self._outputs[#self._outputs + 1] = { name, tensor.id }
  return self
end

--- The graph spec as JSON text: {"deepx": 1, "inputs", "nodes", "outputs"}, keys in the
-- order the Go SDK writes them.
function Graph:spec_json()
  if #self._outputs == 0 then
    errors.raise("GraphError", "the graph has no outputs: name at least one (graph:output)")
  end
  local names = {}
  for name in pairs(self._inputs) do names[#names + 1] = name end
  table.sort(names)
  local inputs = {}
  for i, name in ipairs(names) do
    local input = self._inputs[name]
    inputs[i] = json.quote(name) .. ':{"shape":' .. json.encode(input.shape) ..
        ',"dtype":' .. json.quote(input.dtype) .. "}"
  end
  local nodes = {}
  for i, node in ipairs(self._nodes) do
    local parts = { '{"id":', json.quote(node.id), ',"op":', json.quote(node.op), ',"args":',
      json.encode(node.args) }
    if node.shape then parts[#parts + 1] = ',"shape":' .. json.encode(node.shape) end
    if node.dtype then parts[#parts + 1] = ',"dtype":' .. json.quote(node.dtype) end
    if node.attrs then parts[#parts + 1] = ',"attrs":' .. json.encode(json.object(node.attrs)) end
    nodes[i] = table.concat(parts) .. "}"
  end
  local outputs = {}
  for i, o in ipairs(self._outputs) do
    outputs[i] = o[1] == o[2] and json.quote(o[2]) or "{" .. json.quote(o[1]) .. ":" ..
        json.quote(o[2]) .. "}"
  end
  return '{"deepx":1,"inputs":{' .. table.concat(inputs, ",") .. '},"nodes":[' ..
      table.concat(nodes, ",") .. '],"outputs":[' .. table.concat(outputs, ",") .. "]}"
end

--- The graph spec as a table (as deepx.json reads it back).
function Graph:spec()
  return json.decode(self:spec_json())
end

require("deepx.generated.operators")(Graph)

return M
