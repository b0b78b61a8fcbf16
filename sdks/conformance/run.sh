#!/usr/bin/env bash
# The conformance suite: start a gateway on loopback, run every language's runner on every
# case in sdks/conformance/cases/, print a line per language and transport
# (`<language> <transport>: N passed, N failed`); the exit code is 1 where any failed.
#
#   sdks/conformance/run.sh            (PYTHON: the interpreter with deepx_flow; default
#                                       the repository's .venv, else python3)
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
[ -x "$python" ] || python=python3
work=$(mktemp -d "${TMPDIR:-/tmp}/deepx-conformance.XXXXXX")
export DEEPX_DB_URL="sqlite:///$work/conformance.db"  # (a database of its own)
"$python" -m deepx_flow.cli.main serve --http-port 0 --grpc-port 0 --metrics-port 0 \
  --results "$work/results" 2> "$work/serve.log" &
server=$!
stop() {  # the gateway stopped (killed where it does not within 60 s) and its folder removed
  kill -TERM $server 2>/dev/null
  for _ in $(seq 600); do kill -0 $server 2>/dev/null || break; sleep 0.1; done
  kill -KILL $server 2>/dev/null
  rm -rf "$work"
}
trap stop EXIT
trap 'exit 130' INT TERM  # (then stop, as at any exit)
for _ in $(seq 600); do  # (up to a minute for the embedded cluster to start)
  url=$(sed -n 's/.*HTTP on \([^,]*\),.*/\1/p' "$work/serve.log" | head -1)
  [ -n "$url" ] && break
  kill -0 $server 2>/dev/null || { cat "$work/serve.log"; exit 1; }
  sleep 0.1
done
[ -n "$url" ] || { echo "the gateway did not start"; cat "$work/serve.log"; exit 1; }
export DEEPX_URL="http://$url"

# each language whose toolchain is here (one missing is said, and fails the run where
# DEEPX_REQUIRE_SDK_TOOLCHAINS is set)
status=0
missing() {
  echo "$1: not run ($2 is not installed)"
  [ -z "${DEEPX_REQUIRE_SDK_TOOLCHAINS:-}" ] || status=1
}
if command -v node > /dev/null; then
  node "$root/sdks/javascript/conformance.mjs" "$here/cases" || status=1
else missing javascript node; fi
if command -v go > /dev/null; then
  (cd "$root/sdks/go" && go build -o "$work/go-conformance" ./cmd/conformance) &&
    "$work/go-conformance" "$here/cases" || status=1
else missing go go; fi
exit $status
