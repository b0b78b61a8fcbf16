-- The conformance suite's runner for Lua (conformance.sh calls it; sdks/conformance/run.sh
-- calls that): every case (case.lua) and scenario (scenario.lua) in the folders given, against
-- the gateway at DEEPX_URL. Prints each failure and one line: `lua http: N passed, N failed`.
--
--   lua5.4 conformance/main.lua FOLDER...   (of cases and scenarios)

local here = arg[0]:match("^(.*)/conformance/[^/]*$") or "."
package.path = here .. "/?.lua;" .. here .. "/?/init.lua;" .. package.path

local deepx = require("deepx")
local case = require("conformance.case")
local scenario = require("conformance.scenario")

local PREFIX = "lua_http_" -- (this runner's assets, on a gateway others use too)

local function json_files(folder)
  local listing = io.popen('ls -1 "' .. folder:gsub('"', '\\"') .. '"')
  local files = {}
  for file in listing:lines() do
    if file:match("%.json$") then files[#files + 1] = folder .. "/" .. file end
  end
  listing:close()
  table.sort(files)
  return files
end

local files = {}
for _, folder in ipairs(arg) do
  local found = json_files(folder)
  table.move(found, 1, #found, #files + 1, files)
end

local client = deepx.client(os.getenv("DEEPX_URL"))
local passed, failed = 0, 0
for _, file in ipairs(files) do
  local ok, err = pcall(function()
    local handle = assert(io.open(file, "rb"))
    local text = handle:read("a"):gsub("{prefix}", PREFIX)
    handle:close()
    local c = deepx.json.decode(text)
    if c.scenario then scenario(c, client) else case.run(c, client) end
  end)
  if ok then
    passed = passed + 1
  else
    failed = failed + 1
    local said = type(err) == "table" and (err.conformance or err.message) or err
    if deepx.is_error(err) then said = err.kind .. ": " .. tostring(err) end
    print(string.format("FAILED %s: %s", file:match("[^/]*$"), tostring(said)))
  end
end
print(string.format("lua http: %d passed, %d failed", passed, failed))
os.exit(failed > 0 and 1 or 0)
