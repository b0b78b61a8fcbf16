-- The gateway's contract over HTTP (docs/contract.md), on LuaSocket: analyze and run graphs,
-- follow operations, runs and assets, call served models. Tensors travel as the protocol's
-- binary data both ways. Every call returns its answer or raises a deepx error (errors.lua)
-- with the gateway's kind, message and HTTP status.

local http = require("socket.http")
local ltn12 = require("ltn12")
local url_escape = require("socket.url").escape

local errors = require("deepx.errors")
local graph = require("deepx.graph")
local json = require("deepx.json")
local tensors = require("deepx.tensors")
local OPERATORS = require("deepx.generated.table")
local VERSION = require("deepx.generated.version")

local HEADER_LENGTH = "Inference-Header-Content-Length"
-- (the Open Inference Protocol's calls answer {"error"} alone: the kind is the status's)
local KIND_OF_STATUS = { [400] = "InputError", [401] = "Unauthenticated", [404] = "NotFound",
  [405] = "NotFound", [413] = "TooLarge", [500] = "ExecutionError" }

-- (answers are read with a null field left out: nil, as Lua has it)
local ANSWER = { drop_nulls = true }

local Client = { __name = "deepx.Client" }
Client.__index = Client

-- WAIT_SECONDS: how long one exchange of execute or materialize waits for the operation to
-- end, before asking for it again by id (a run may outlast any one exchange; tests set less).
local M = { Client = Client, WAIT_SECONDS = 60 }

--- A client of the gateway at url (deepx-flow serve's HTTP port). options: token (a bearer
-- token, for a gateway that needs one; else DEEPX_GATEWAY_TOKEN where set), timeout (seconds
-- one exchange may stay silent; default 600, well above the 60 s an exchange waits).
function M.new(url, options)
  options = options or {}
  local token = options.token
  if token == nil then token = os.getenv("DEEPX_GATEWAY_TOKEN") end
  if token == "" then token = nil end
  return setmetatable({ url = (url or "http://127.0.0.1:8000"):gsub("/+$", ""), token = token,
    timeout = options.timeout or 600 }, Client)
end

local function escape(text)
  return (url_escape(tostring(text)))
end

-- A new operation id: 32 random lower-case hex digits (from /dev/urandom where there is one).
local function new_operation_id()
  local random = io.open("/dev/urandom", "rb")
  local bytes = random and random:read(16)
  if random then random:close() end
  if not bytes or #bytes ~= 16 then
    local made = {}
    for i = 1, 16 do made[i] = string.char(math.random(0, 255)) end
    bytes = table.concat(made)
  end
  return (bytes:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

-- The graph as JSON for a request: a Graph's spec, JSON text as it is, or a spec table.
local function spec_of(g)
  if getmetatable(g) == graph.Graph then return json.raw(g:spec_json()) end
  if type(g) == "string" then return json.raw(g) end
  return g
end

-- Raise what the gateway answered with a status >= 400.
local function refused(status, body)
  local message, kind = body, KIND_OF_STATUS[status] or "RemoteError"
  local ok, said = pcall(json.decode, body, ANSWER)
  if ok and type(said) == "table" and type(said.error) == "string" then
    message = said.error
    if type(said.kind) == "string" then kind = said.kind end
  end
  errors.raise(kind, message, { status = status })
end

-- (the body in one piece: ltn12.source.string would send it 2 KiB at a time)
local function whole(body)
  local sent = false
  return function()
    if sent then return nil end
    sent = true
    return body
  end
end

-- One HTTP call: the answer's bytes and the length of its JSON head (nil: all of it).
function Client:_call(method, path, body, head_length)
  local headers = { ["Content-Type"] = "application/json" }
  if head_length then
    headers["Content-Type"] = "application/octet-stream"
    headers[HEADER_LENGTH] = tostring(head_length)
  end
  headers["Content-Length"] = tostring(body and #body or 0)
  if self.token then headers["Authorization"] = "Bearer " .. self.token end
  local chunks = {}
  http.TIMEOUT = self.timeout
  local ok, status, answer_headers = http.request({
    url = self.url .. path, method = method, headers = headers,
    source = body and whole(body), sink = ltn12.sink.table(chunks),
  })
  if not ok then
    errors.raise("RemoteError", "cannot reach the gateway at " .. self.url .. ": " .. tostring(status))
  end
  local data = table.concat(chunks)
  if status >= 400 then refused(status, data) end
  local length = answer_headers[HEADER_LENGTH:lower()]
  if length then
    length = math.tointeger(tonumber(length))
    if not length or length > #data then
      errors.raise("RemoteError", "the gateway sent a bad " .. HEADER_LENGTH)
    end
  end
  return data, length
end

function Client:_json(method, path, body)
  local data = self:_call(method, path, body ~= nil and json.encode(body) or nil)
  local ok, out = pcall(json.decode, data, ANSWER)
  if not ok then
    errors.raise("RemoteError", "the gateway's answer is not JSON: " .. tostring(out.message or out))
  end
  return out
end

-- An answer with outputs (an operation, an inference): its JSON head, outputs made tensors
-- from the binary data after it.
local function operation_of(data, length)
  local ok, head = pcall(json.decode, length and data:sub(1, length) or data, ANSWER)
  if not ok or type(head) ~= "table" then
    errors.raise("RemoteError", "the gateway's answer is not JSON: " ..
      tostring(type(head) == "table" and head.message or head))
  end
  if getmetatable(head.outputs) == json.array_mt then
    local outputs, at = {}, (length or #data) + 1
    for _, entry in ipairs(head.outputs) do
      local shape = {}
      for i, d in ipairs(entry.shape or {}) do shape[i] = math.tointeger(d) end
      -- (every call asks for binary outputs)
      local bytes = type(entry.parameters) == "table" and
          math.tointeger(entry.parameters.binary_data_size)
      if not bytes or at + bytes - 1 > #data then
        errors.raise("RemoteError", "output " .. errors.shown(entry.name) ..
          " came without its binary data")
      end
      outputs[entry.name] = tensors.from_raw(entry.datatype, shape, data, at, at + bytes - 1)
      at = at + bytes
    end
    head.outputs = outputs
  end
  return head
end

-- A request with tensors: the JSON head, then each input's bytes (names in sorted order).
function Client:_with_tensors(path, body, inputs)
  local names, listed, parts = {}, json.array(), {}
  for name in pairs(inputs or {}) do names[#names + 1] = name end
  table.sort(names)
  for i, name in ipairs(names) do
    local t = inputs[name]
    local ok, raw = pcall(tensors.raw, t)
    if not ok then
      if errors.is_error(raw) then raw.message = "input " .. errors.shown(name) .. ": " .. raw.message end
      error(raw, 0)
    end
    parts[i] = raw
    listed[i] = { name = name, datatype = tensors.WIRE[t.dtype], shape = json.array(t.shape),
      parameters = { binary_data_size = #raw } }
  end
  body.inputs = listed
  local head = json.encode(body)
  return operation_of(self:_call("POST", path, head .. table.concat(parts), #head))
end

--- What the gateway speaks: protocol version, operator table and its hash, limits.
function Client:capabilities()
  return self:_json("GET", "/v1/capabilities")
end

local function listed_or_none(names)
  table.sort(names)
  return #names > 0 and table.concat(names, ", ") or "none"
end

--- The capabilities, once the gateway is found to speak this SDK's protocol and operator
-- table (a RemoteError saying what differs, otherwise), as Python's dx.connect checks.
function Client:check_server()
  local caps = self:capabilities()
  if caps.protocol_version ~= VERSION.protocol_version then
    errors.raise("RemoteError", string.format("%s speaks %s, this SDK %s", self.url,
      errors.shown(caps.protocol_version), VERSION.protocol_version))
  end
  if caps.operator_table_hash ~= VERSION.operator_table_hash then
    local theirs, missing, unknown = {}, {}, {}
    for _, op in ipairs(caps.operators or {}) do theirs[op.name] = true end
    for name in pairs(OPERATORS) do
      if not theirs[name] then missing[#missing + 1] = name end
    end
    for name in pairs(theirs) do
      if not OPERATORS[name] then unknown[#unknown + 1] = name end
    end
    errors.raise("RemoteError", string.format("%s has another operator table than this SDK: " ..
      "missing %s; not in this SDK %s (upgrade one side)", self.url, listed_or_none(missing),
      listed_or_none(unknown)))
  end
  return caps
end

--- The gateway's analysis of graph (a Graph, or a spec): every node's shape and dtype, and
-- the plan.
function Client:analyze(g)
  return self:_json("POST", "/v1/graphs:analyze", { graph = spec_of(g) })
end

-- The operation answer once it ended: asked for again by id, WAIT_SECONDS at a time, while
-- it is running (the gateway goes on running it whatever an exchange's timeout).
function Client:_ended(answer)
  while answer.state == "running" do
    answer = self:operation(answer.operation, { wait_seconds = M.WAIT_SECONDS })
  end
  return answer
end

--- Run graph on inputs (name -> tensor, see deepx.tensor) and wait for its outputs:
-- {state, operation, run_id, outputs = {name = tensor}, ...}. options: outputs (the names
-- to return), operation_id (an id of the caller's; else one made here), wait_seconds (how
-- long to wait: the answer may then be "running", to follow with client:operation).
function Client:execute(g, inputs, options)
  options = options or {}
  local body = { graph = spec_of(g), parameters = { binary_data_output = true },
    outputs = options.outputs, wait_seconds = options.wait_seconds or M.WAIT_SECONDS,
    operation_id = options.operation_id or new_operation_id() }
  local answer = self:_with_tensors("/v1/graphs:execute", body, inputs)
  if options.wait_seconds ~= nil then return answer end
  return self:_ended(answer)
end

--- Start running graph on inputs and answer at once: the operation, "running" (or ended
-- already); follow it with client:operation(id, {wait_seconds}).
function Client:start(g, inputs, options)
  local given = { wait_seconds = 0 }
  for k, v in pairs(options or {}) do given[k] = v end
  return self:execute(g, inputs, given)
end

--- An operation (a graph's execution, an asset's materialization) as the gateway has it
-- now, or once it ends within options.wait_seconds.
function Client:operation(id, options)
  local wait = (options or {}).wait_seconds
  local path = "/v1/operations/" .. escape(id) .. "?binary_data_output=true" ..
      (wait and wait > 0 and "&wait_seconds=" .. tostring(wait) or "")
  return operation_of(self:_call("GET", path))
end

--- Stop a running operation: the operation once it ended, without outputs (ask for one that
-- had succeeded again, client:operation(id), for them).
function Client:cancel(id)
  return self:_json("POST", "/v1/operations/" .. escape(id) .. ":cancel")
end

--- The runs the gateway's database records, newest first. options: status (running,
-- succeeded, failed, interrupted), limit.
function Client:runs(options)
  options = options or {}
  local query = {}
  if options.status then query[#query + 1] = "status=" .. escape(options.status) end
  if options.limit then query[#query + 1] = "limit=" .. tostring(options.limit) end
  local path = "/v1/runs" .. (#query > 0 and "?" .. table.concat(query, "&") or "")
  return self:_json("GET", path).runs
end

--- One run by id (or a prefix of it): its status, tasks, workers, times, error.
function Client:run(id)
  return self:_json("GET", "/v1/runs/" .. escape(id))
end

--- Define (or define again) asset name computed by graph (one output; each input reads the
-- upstream asset of its name). options: dependencies, description, partitions,
-- partition_axis, checks (as docs/contract.md lists them).
function Client:define_asset(name, g, options)
  options = options or {}
  return self:_json("POST", "/v1/assets:define", { name = name, graph = spec_of(g),
    dependencies = options.dependencies, description = options.description,
    partitions = options.partitions, partition_axis = options.partition_axis,
    checks = options.checks })
end

--- Every asset defined: name, status, latest version, checks, ...
function Client:assets()
  return self:_json("GET", "/v1/assets").assets
end

--- The stored versions of asset name, newest first.
function Client:asset_versions(name)
  return self:_json("GET", "/v1/assets/" .. escape(name) .. "/versions").versions
end

--- Make a new version of asset name (what is stale, or all with force) and wait for it: the
-- operation, whose materialized says what was made and checked. options: partitions, force,
-- upstream, operation_id (an id of the caller's; else one made here), wait_seconds (how long
-- to wait: the answer may then be "running", to follow with client:operation).
function Client:materialize(name, options)
  options = options or {}
  local answer = self:_json("POST", "/v1/assets/" .. escape(name) .. ":materialize", json.object({
    partitions = options.partitions, force = options.force, upstream = options.upstream,
    wait_seconds = options.wait_seconds or M.WAIT_SECONDS,
    operation_id = options.operation_id or new_operation_id() }))
  if options.wait_seconds ~= nil then return answer end
  return self:_ended(answer)
end

--- The newest usable version of asset name as a tensor. options: version, partition, slice
-- ({start, stop} per leading axis).
function Client:read_asset(name, options)
  options = options or {}
  local body = { parameters = { binary_data_output = true }, version = options.version,
    partition = options.partition, slice = options.slice }
  local answer = operation_of(self:_call("POST", "/v1/assets/" .. escape(name) .. ":read",
    json.encode(body)))
  return answer.outputs[name]
end

--- Call served model (the Open Inference Protocol's infer) on inputs (name -> tensor):
-- {model_name, outputs = {name = tensor}, ...}. options: version.
function Client:infer(model, inputs, options)
  local version = (options or {}).version
  local path = "/v2/models/" .. escape(model) ..
      (version and "/versions/" .. escape(version) or "") .. "/infer"
  return self:_with_tensors(path, { parameters = { binary_data_output = true } }, inputs)
end

return M
