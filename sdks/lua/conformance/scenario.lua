-- A conformance scenario (sdks/conformance/make_scenarios.py): its calls made in order
-- against the gateway, each checked for what make_scenarios.py says it must give.

local case = require("conformance.case")

local fail, graph_of, inputs_of = case.fail, case.graph_of, case.inputs_of

local function expect_state(done, state)
  if done.state ~= state then fail("%s, not %s: %s", done.state, state, tostring(done.error)) end
end

-- Each call, by its "do".
local CALLS = {}

function CALLS.define_asset(call, client)
  client:define_asset(call.asset, graph_of(call.graph))
end

function CALLS.materialize(call, client)
  expect_state(client:materialize(call.asset), call.state)
end

function CALLS.read_asset(call, client)
  case.compare(client:read_asset(call.asset), case.values(call.expected), call.rtol, call.atol,
    call.asset)
end

function CALLS.list_assets(call, client)
  local listed = {}
  for _, asset in ipairs(client:assets()) do listed[asset.name] = true end
  for _, name in ipairs(call.includes) do
    if not listed[name] then fail("%s is not listed", name) end
  end
end

function CALLS.asset_versions(call, client)
  local versions = client:asset_versions(call.asset)
  if #versions < call.at_least then fail("%d versions of %s", #versions, call.asset) end
end

-- Run the call's graph; with "follow", start it and ask again until it ends, and check what
-- following a run shows: progress, the dashboard link, the run in the catalog.
function CALLS.execute(call, client)
  local g = graph_of(call.graph)
  if not call.follow then
    local done = client:execute(g, inputs_of(call.inputs))
    expect_state(done, "succeeded")
    return case.compare_all(done.outputs, call.expected, call.rtol, call.atol)
  end
  local done = client:start(g, inputs_of(call.inputs))
  while done.state == "running" do
    done = client:operation(done.operation, { wait_seconds = 1 })
  end
  expect_state(done, "succeeded")
  local progress = done.progress or {}
  if not progress.tasks_total or progress.tasks_total == 0 or
      progress.tasks_done ~= progress.tasks_total then
    fail("progress %s", require("deepx").json.encode(progress))
  end
  local suffix = "/run?id=" .. done.run_id
  if type(done.dashboard) ~= "string" or done.dashboard:sub(-#suffix) ~= suffix then
    fail("dashboard %s", tostring(done.dashboard))
  end
  local run = client:run(done.run_id)
  if run.status ~= "succeeded" then fail("its run: %s", tostring(run.status)) end
  local listed = false
  for _, r in ipairs(client:runs({ limit = 100 })) do listed = listed or r.id == done.run_id end
  if not listed then fail("the run %s is not listed", done.run_id) end
  case.compare_all(done.outputs, call.expected, call.rtol, call.atol)
end

function CALLS.infer(call, client)
  local ok, done = pcall(client.infer, client, call.model, inputs_of(call.inputs))
  if call.error then
    if ok then fail("not refused") end
    return case.refused(done, call.error)
  end
  if not ok then error(done, 0) end
  case.compare_all(done.outputs, call.expected, call.rtol, call.atol)
end

function CALLS.cancel(call, client)
  local started = client:start(graph_of(call.graph), inputs_of(call.inputs))
  expect_state(started, "running")
  local done = client:cancel(started.operation)
  expect_state(done, "interrupted")
  if not tostring(done.error):find("cancelled", 1, true) then
    fail("the error: %s", tostring(done.error))
  end
  local run = client:run(done.run_id)
  if run.status ~= "interrupted" then fail("its run: %s", tostring(run.status)) end
end

-- Run to its end, then cancel: that changes nothing (still "succeeded"), the answer has no
-- outputs, and the operation asked for again still has them.
function CALLS.cancel_ended(call, client)
  local done = client:execute(graph_of(call.graph), inputs_of(call.inputs))
  expect_state(done, "succeeded")
  local cancelled = client:cancel(done.operation)
  expect_state(cancelled, "succeeded")
  if cancelled.outputs ~= nil then fail("a cancel answered outputs") end
  local again = client:operation(done.operation)
  for _, output in ipairs(call.graph.outputs) do
    local name = output[1]
    if not done.outputs[name] then fail("%s: no such output", name) end
    case.compare((again.outputs or {})[name], done.outputs[name], 0, 0, name)
  end
end

-- The gateway's analysis: these inputs and outputs (name, datatype, shape, in order), a
-- plan, at least one task.
function CALLS.analyze(call, client)
  local answer = client:analyze(graph_of(call.graph))
  for _, side in ipairs({ "inputs", "outputs" }) do
    local got, want = answer[side], call.analysis[side]
    if #got ~= #want then fail("the %s: %d, not %d", side, #got, #want) end
    for i, w in ipairs(want) do
      local g = got[i]
      local same = g.name == w.name and g.datatype == w.datatype and #g.shape == #w.shape
      for j, d in ipairs(w.shape) do same = same and g.shape[j] == d end
      if not same then fail("the %s' %s: %s %s", side, w.name, tostring(g.name), tostring(g.datatype)) end
    end
  end
  if type(answer.plan) ~= "string" or answer.plan == "" then fail("no plan") end
  if not (answer.tasks and answer.tasks >= 1) then fail("tasks %s", tostring(answer.tasks)) end
end

-- The SDK carries the stored protocol and table hash, and finds the gateway speaks them.
function CALLS.check_server(call, client)
  local deepx = require("deepx")
  if deepx.PROTOCOL_VERSION ~= call.protocol_version or
      deepx.OPERATOR_TABLE_HASH ~= call.operator_table_hash then
    fail("this SDK: %s %s", deepx.PROTOCOL_VERSION, deepx.OPERATOR_TABLE_HASH)
  end
  local caps = client:check_server()
  if caps.operator_table_hash ~= call.operator_table_hash then
    fail("the gateway's hash: %s", tostring(caps.operator_table_hash))
  end
end

-- Every call of the scenario, in order; a failure names the call.
return function(s, client)
  for i, call in ipairs(s.scenario) do
    local make = CALLS[call["do"]]
    local ok, err = pcall(function()
      if not make then fail("no such call") end
      make(call, client)
    end)
    if not ok then
      local said = type(err) == "table" and err.conformance or tostring(err)
      fail("call %d (%s): %s", i, tostring(call["do"]), said)
    end
  end
end
