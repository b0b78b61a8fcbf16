-- The rockspec lists the SDK's modules: a module added is a module installed.
describe("the rockspec", function()
  it("installs every module of the SDK, and only those", function()
    local rock = {}
    assert(loadfile("deepx-flow-dev-1.rockspec", "t", rock))()
    local listed = {}
    for name, path in pairs(rock.build.modules) do
      assert.are.equal(path, name:gsub("%.", "/"):gsub("^deepx$", "deepx/init") .. ".lua")
      listed[path] = true
    end
    local found = io.popen("find deepx -name '*.lua'")
    local count = 0
    for path in found:lines() do
      assert.is_true(listed[path], path .. " is not in the rockspec")
      count = count + 1
    end
    found:close()
    local n = 0
    for _ in pairs(listed) do n = n + 1 end
    assert.are.equal(n, count)
  end)
end)
