#!/usr/bin/env bash
# The conformance suite: start a gateway on loopback (serving model.py's classifier), run
# every language's runner on every case in sdks/conformance/cases/ and every scenario in
# sdks/conformance/scenarios/, print a line per language and transport
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
"$python" "$here/model.py" "$work/models" || exit 1  # (the model the scenarios call)
"$python" -m deepx_flow.cli.main serve --http-port 0 --grpc-port 0 --metrics-port 0 \
  --results "$work/results" --model-repository "$work/models" 2> "$work/serve.log" &
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

export DEEPX_GRPC="$(sed -n 's/.*gRPC on \([^ ,]*\).*/\1/p' "$work/serve.log" | head -1)"

# each language's runner, sdks/<language>/conformance.sh, with the folders of cases and
# scenarios (it runs both, and counts each file as one): it prints
# its lines, and exits 3 where its toolchain is not installed (said, and a failure where
# DEEPX_REQUIRE_SDK_TOOLCHAINS is set)
status=0
for runner in "$root"/sdks/*/conformance.sh; do
  bash "$runner" "$here/cases" "$here/scenarios"
  case $? in
    0) ;;
    3) [ -z "${DEEPX_REQUIRE_SDK_TOOLCHAINS:-}" ] || status=1 ;;
    *) status=1 ;;
  esac
done
exit $status
