#!/usr/bin/env bash
# JavaScript's conformance runner (sdks/conformance/run.sh calls it with the folders of cases
# and scenarios; DEEPX_URL is the gateway): prints `javascript http: N passed, N failed`.
# Exit 3: Node.js is not installed.
set -uo pipefail
command -v node > /dev/null || { echo "javascript: not run (node is not installed)"; exit 3; }
exec node "$(dirname "$0")/conformance.mjs" "$@"
