-- `luarocks make` in this folder installs the modules (no download: LuaSocket is Debian's
-- lua-socket, or any LuaSocket already installed).
rockspec_format = "3.0"
package = "deepx-flow"
version = "dev-1"
source = { url = "." } -- (a checkout: `luarocks make` builds from this folder)
description = {
  summary = "deepx_flow for Lua: tensor graphs, runs, assets and served models over a gateway",
  license = "Apache-2.0",
}
dependencies = { "lua >= 5.4" }
build = {
  type = "builtin",
  modules = {
    ["deepx"] = "deepx/init.lua",
    ["deepx.client"] = "deepx/client.lua",
    ["deepx.errors"] = "deepx/errors.lua",
    ["deepx.graph"] = "deepx/graph.lua",
    ["deepx.json"] = "deepx/json.lua",
    ["deepx.tensors"] = "deepx/tensors.lua",
    ["deepx.generated.operators"] = "deepx/generated/operators.lua",
    ["deepx.generated.table"] = "deepx/generated/table.lua",
    ["deepx.generated.version"] = "deepx/generated/version.lua",
  },
}
