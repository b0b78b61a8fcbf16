-- Against a running gateway (DEEPX_URL, as the Python tests start one; pending without):
-- graphs built here run there, outputs come back exact in every dtype, runs and assets are
-- followed, and the gateway's refusals arrive as deepx errors with their kind and status.
local deepx = require("deepx")

local url = os.getenv("DEEPX_URL")

-- it(), or pending where no gateway is named
local function with_gateway(name, body)
  if url and url ~= "" then
    it(name, body)
  else
    pending(name .. " (DEEPX_URL names no gateway)")
  end
end

-- the deepx error fn raises, or a failure
local function refusal(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "no error was raised")
  assert.is_true(deepx.is_error(err), tostring(err))
  return err
end

describe("the client", function()
  with_gateway("runs a graph built here, and its outputs come back with shape and dtype", function()
    local g = deepx.graph()
    local x = g:input("x", { 2, 3 })
    local y = g:leaky_relu(g:mul(x, 2), { alpha = 0.5 })
    g:output(g:sum(y, { axes = { 1 } }), "total"):output(g:argmax(x, { axis = 1 }), "label")
    local done = deepx.client(url):execute(g, { x = deepx.tensor({ 1, -2, 3, -4, 5, -6 }, { 2, 3 }) })
    assert.are.equal("succeeded", done.state)
    assert.are.same({ shape = { 2 }, dtype = "float32", data = { 2 - 2 + 6, -4 + 10 - 6 } },
      done.outputs.total)
    assert.are.same({ shape = { 2 }, dtype = "int64", data = { 2, 1 } }, done.outputs.label)
    assert.are.equal("integer", math.type(done.outputs.label.data[1]))
  end)

  with_gateway("sends and receives int64 past 2^53 and uint64 past 2^63 exactly", function()
    local g = deepx.graph()
    local n = g:input("n", { 2 }, "int64")
    local u = g:input("u", { 3 }, "uint64")
    g:output(g:add(n, 1), "next"):output(g:flip(u), "flipped")
    local big = (1 << 62) + 3
    local done = deepx.client(url):execute(g, {
      n = deepx.tensor({ big, -big }, { 2 }, "int64"),
      u = deepx.tensor({ "18446744073709551615", 0, (1 << 63) + 1 }, { 3 }, "uint64"),
    })
    assert.are.same({ big + 1, -big + 1 }, done.outputs.next.data)
    assert.are.same({ (1 << 63) + 1, 0, -1 }, done.outputs.flipped.data)
    assert.are.equal("18446744073709551615", deepx.uint64_tostring(done.outputs.flipped.data[3]))
  end)

  with_gateway("gives the gateway's analysis: every output's shape and dtype, and the plan", function()
    local g = deepx.graph()
    local x = g:input("x", { 4, 5 })
    g:output(g:matmul(x, g:transpose(x)), "gram")
    local analysis = deepx.client(url):analyze(g)
    assert.are.equal("gram", analysis.outputs[1].name)
    assert.are.same({ 4, 4 }, { table.unpack(analysis.outputs[1].shape) })
    assert.are.equal("FP32", analysis.outputs[1].datatype)
    assert.is_truthy(analysis.plan:find("matmul", 1, true))
  end)

  with_gateway("raises the gateway's refusals as errors with their kind, message and status", function()
    local client = deepx.client(url)
    local spec = '{"deepx": 1, "inputs": {"x": {"shape": [2], "dtype": "float32"}}, ' ..
        '"nodes": [{"id": "y", "op": "add", "args": ["x", "missing"]}], "outputs": ["y"]}'
    local err = refusal(client.execute, client, spec, { x = deepx.tensor({ 1, 2 }) })
    assert.are.equal("SpecError", err.kind)
    assert.are.equal(400, err.status)
    assert.is_truthy(err.message:find("missing input 'missing'", 1, true))
    local g = deepx.graph()
    g:output(g:relu(g:input("x", { 2 })))
    err = refusal(client.execute, client, g, { x = deepx.tensor({ 1, 2, 3 }) })
    assert.are.equal("InputError", err.kind)
    assert.are.equal(400, err.status)
    err = refusal(client.execute, client, g, { x = deepx.tensor({ 1, 2.5 }, { 2 }, "int8") })
    assert.are.equal("input 'x': 2.5 is not a int8 value", tostring(err))
    err = refusal(client.operation, client, "no-such-operation")
    assert.are.equal("NotFound", err.kind)
    assert.are.equal(404, err.status)
    -- (the Open Inference Protocol's answer has no kind: the status says it)
    err = refusal(client.infer, client, "no_such_model", { x = deepx.tensor({ 1 }) })
    assert.are.equal("NotFound", err.kind)
    assert.are.equal(404, err.status)
    local nowhere = deepx.client("http://127.0.0.1:9")
    err = refusal(nowhere.runs, nowhere)
    assert.are.equal("RemoteError", err.kind)
    assert.is_truthy(tostring(err):find("cannot reach the gateway at http://127.0.0.1:9", 1, true))
  end)

  with_gateway("follows an operation by id, with its progress, and lists its run", function()
    local client = deepx.client(url)
    local g = deepx.graph()
    g:output(g:exp(g:input("x", { 3 })), "e")
    local started = client:start(g, { x = deepx.tensor({ 0, 1, 2 }) })
    local again = started
    while again.state == "running" do
      again = client:operation(started.operation, { wait_seconds = 1 })
    end
    assert.are.equal("succeeded", again.state)
    assert.are.same({ 3 }, again.outputs.e.shape)
    for i, v in ipairs(again.outputs.e.data) do
      assert.is_true(math.abs(v - math.exp(i - 1)) <= 1e-6 * math.exp(i - 1), tostring(v))
    end
    assert.are.equal(again.progress.tasks_total, again.progress.tasks_done)
    assert.are.equal("/run?id=" .. again.run_id, again.dashboard:match("/run%?id=.*$"))
    local newest = client:runs({ limit = 1 })[1]
    assert.are.equal(again.run_id, newest.id)
    assert.are.equal("succeeded", client:run(again.run_id).status)
    -- (a field the gateway answers null is nil, as Lua leaves out what is not there)
    assert.is_nil(started.run_id)
    -- (cancelling what has ended changes nothing: its final state, without outputs)
    local cancelled = client:cancel(started.operation)
    assert.are.equal("succeeded", cancelled.state)
    assert.is_nil(cancelled.outputs)
    assert.are.equal(3, #client:operation(started.operation).outputs.e.data)
  end)

  with_gateway("defines assets from graphs, materializes, lists and reads them", function()
    local client = deepx.client(url)
    local name = string.format("lua_readings_%d_%d", os.time(), math.random(1 << 30))
    local g = deepx.graph()
    local n = g:arange({ shape = { 8 }, dtype = "float64", start = 0, step = 0.5 })
    g:output(g:reshape(n, { shape = { 4, 2 } }), "r")
    client:define_asset(name, g, { description = "eight readings", checks = { { kind = "all_finite" } } })
    local totals = deepx.graph()
    totals:output(totals:sum(totals:input(name, { 4, 2 }, "float64"), { axes = { 1 } }), "t")
    client:define_asset(name .. "_totals", totals)
    local made = client:materialize(name .. "_totals", { upstream = true })
    assert.are.equal("succeeded", made.state, tostring(made.error))
    assert.are.same({ shape = { 4 }, dtype = "float64", data = { 0.5, 2.5, 4.5, 6.5 } },
      client:read_asset(name .. "_totals"))
    local slice = client:read_asset(name, { slice = { { 1, 3 } } })
    assert.are.same({ shape = { 2, 2 }, dtype = "float64", data = { 1, 1.5, 2, 2.5 } }, slice)
    local listed
    for _, asset in ipairs(client:assets()) do
      if asset.name == name then listed = asset end
    end
    assert.are.equal("fresh", listed.status)
    assert.is_true(client:asset_versions(name)[1].checks_passed)
    assert.are.equal("NotFound", refusal(client.read_asset, client, "no_such_asset").kind)
  end)
end)

-- A graph that runs for about half a second: a chain of 1024x1024 matmuls.
local function slow_graph()
  local g = deepx.graph()
  local a = g:full({ shape = { 1024, 1024 }, dtype = "float32", value = 1 / 1024 })
  local m = a
  for _ = 1, 8 do m = g:matmul(m, a) end
  return g:output(g:slice(m, { starts = { 0, 0 }, stops = { 1, 2 } }), "corner")
end

describe("the client's waits", function()
  local client_module = require("deepx.client")
  local slice = client_module.WAIT_SECONDS

  after_each(function() client_module.WAIT_SECONDS = slice end)

  it("are a minute at a time", function()
    assert.are.equal(60, slice)
  end)

  with_gateway("ask again by id while a run outlasts one exchange, and get its outputs", function()
    client_module.WAIT_SECONDS = 0.001 -- (submitting the run alone takes longer)
    local client = deepx.client(url)
    local asked = spy.on(client, "operation")
    local done = client:execute(slow_graph(), {})
    assert.are.equal("succeeded", done.state, tostring(done.error))
    assert.are.same({ shape = { 1, 2 }, dtype = "float32", data = { 2.0 ^ -10, 2.0 ^ -10 } },
      done.outputs.corner)
    assert.spy(asked).was.called()
    assert.spy(asked).was.called_with(client, done.operation, { wait_seconds = 0.001 })
    -- (the operation's id, made here: 32 hex digits)
    assert.is_truthy(done.operation:match("^" .. ("%x"):rep(32) .. "$"), done.operation)
  end)

  with_gateway("ask again by id while a materialization outlasts one exchange", function()
    client_module.WAIT_SECONDS = 0.001
    local client = deepx.client(url)
    local name = string.format("lua_slow_%d_%d", os.time(), math.random(1 << 30))
    client:define_asset(name, slow_graph())
    local asked = spy.on(client, "operation")
    local made = client:materialize(name)
    assert.are.equal("succeeded", made.state, tostring(made.error))
    assert.spy(asked).was.called()
    assert.are.same({ shape = { 1, 2 }, dtype = "float32", data = { 2.0 ^ -10, 2.0 ^ -10 } },
      client:read_asset(name))
  end)

  with_gateway("are the caller's where given: the answer as it is, never asked again", function()
    local client = deepx.client(url)
    local asked = spy.on(client, "operation")
    local started = client:execute(slow_graph(), {}, { wait_seconds = 0 })
    assert.are.equal("running", started.state)
    assert.spy(asked).was_not.called()
    assert.are.equal("interrupted", client:cancel(started.operation).state)
  end)

  with_gateway("send the operation id the caller gives", function()
    local client = deepx.client(url)
    local id = string.format("lua-%d-%d", os.time(), math.random(1 << 30))
    local g = deepx.graph()
    g:output(g:neg(g:input("x", { 2 })), "y")
    local done = client:execute(g, { x = deepx.tensor({ 1, -2 }) }, { operation_id = id })
    assert.are.equal(id, done.operation)
    assert.are.same({ -1, 2 }, client:operation(id).outputs.y.data)
    -- (the same id with the same request attaches to that operation)
    assert.are.equal(id, client:execute(g, { x = deepx.tensor({ 1, -2 }) },
      { operation_id = id }).operation)
    local asset = string.format("lua_given_%d_%d", os.time(), math.random(1 << 30))
    local source = deepx.graph()
    client:define_asset(asset, source:output(source:arange({ shape = { 3 }, dtype = "int32" }), "n"))
    local made = client:materialize(asset, { operation_id = id .. "-m" })
    assert.are.equal(id .. "-m", made.operation)
  end)
end)

describe("the client's check of the gateway", function()
  with_gateway("finds the gateway speaks this SDK's protocol and operator table", function()
    local caps = deepx.client(url):check_server()
    assert.are.equal(deepx.PROTOCOL_VERSION, caps.protocol_version)
    assert.are.equal(deepx.OPERATOR_TABLE_HASH, caps.operator_table_hash)
    assert.are.equal(#caps.operators, (function()
      local n = 0
      for _ in pairs(deepx.OPERATORS) do n = n + 1 end
      return n
    end)())
  end)
end)
