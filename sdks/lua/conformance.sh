#!/usr/bin/env bash
# Lua's conformance runner (sdks/conformance/run.sh calls it with the folders of cases and
# scenarios; DEEPX_URL is the gateway): runs conformance/main.lua (Lua needs no build), printing
# `lua http: N passed, N failed`. Exit 3: Lua 5.4 or LuaSocket is not installed.
set -uo pipefail
command -v lua5.4 > /dev/null || { echo "lua: not run (lua5.4 is not installed)"; exit 3; }
lua5.4 -e 'require("socket.http")' 2> /dev/null ||
  { echo "lua: not run (lua-socket is not installed)"; exit 3; }
here="$(cd "$(dirname "$0")" && pwd)"
exec lua5.4 "$here/conformance/main.lua" "$@"
