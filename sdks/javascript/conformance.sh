#!/usr/bin/env bash
# JavaScript's conformance runner (sdks/conformance/run.sh calls it with the folders of cases
# and scenarios; DEEPX_URL is the gateway's HTTP, DEEPX_GRPC its gRPC): prints
# `javascript http: N passed, N failed` and `javascript grpc: ...`. Exit 3: Node.js, or
# the gRPC client's packages (`npm ci` in sdks/javascript), are not installed.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
command -v node > /dev/null || { echo "javascript: not run (node is not installed)"; exit 3; }
if [ ! -d "$here/node_modules/@grpc/grpc-js" ]; then
  echo "javascript grpc: not run (its packages are not installed: npm ci in sdks/javascript)"
  DEEPX_GRPC="" node "$here/conformance.mjs" "$@" || exit 1
  exit 3
fi
exec node "$here/conformance.mjs" "$@"
