-- deepx_flow for Lua: build tensor graphs, run them on a deepx_flow gateway, follow runs,
-- define and read assets, call its served models. The operators are methods of Graph,
-- generated from the operator table (generated/operators.lua).
--
--   local deepx = require("deepx")
--   local g = deepx.graph()
--   g:output(g:relu(g:input("x", {2, 3})), "y")
--   local done = deepx.client(os.getenv("DEEPX_URL")):execute(g, {
--     x = deepx.tensor({1, -2, 3, -4, 5, -6}, {2, 3}) })

local client = require("deepx.client")
local errors = require("deepx.errors")
local graph = require("deepx.graph")
local json = require("deepx.json")
local tensors = require("deepx.tensors")

return {
  graph = graph.new, -- deepx.graph(): an empty Graph
  client = client.new, -- deepx.client(url, {token, timeout}): a Client of a gateway
  tensor = tensors.tensor, -- deepx.tensor(data, shape, dtype)
  to_float32 = tensors.to_float32,
  uint64_tostring = tensors.uint64_tostring,
  uint64_fromstring = tensors.uint64_fromstring,
  is_error = errors.is_error,
  closest = errors.closest,
  Graph = graph.Graph,
  Tensor = graph.Tensor,
  Client = client.Client,
  Error = errors.Error,
  DTYPES = graph.DTYPES,
  WIRE = tensors.WIRE,
  OPERATORS = require("deepx.generated.table"),
  PROTOCOL_VERSION = require("deepx.generated.version").protocol_version,
  OPERATOR_TABLE_HASH = require("deepx.generated.version").operator_table_hash,
  json = json,
}
