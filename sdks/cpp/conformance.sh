#!/usr/bin/env bash
# C++'s conformance runner (sdks/conformance/run.sh calls it with the folders of cases and
# scenarios; DEEPX_URL is the gateway's HTTP, DEEPX_GRPC its gRPC address): builds libdeepx
# and conformance/runner.cpp with CMake into a temporary folder and prints
# `cpp http: N passed, N failed` and `cpp grpc: N passed, N failed`.
# Exit 3: g++ or cmake is not installed.
set -uo pipefail
for tool in g++ cmake; do
  command -v $tool > /dev/null || { echo "cpp: not run ($tool is not installed)"; exit 3; }
done
here="$(cd "$(dirname "$0")" && pwd)"
build=$(mktemp -d "${TMPDIR:-/tmp}/deepx-cpp.XXXXXX")
trap 'rm -rf "$build"' EXIT
# (build type None: no optimization, half the build time; the runner waits on the gateway)
{ cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=None > "$build/cmake.log" 2>&1 &&
  cmake --build "$build" -j2 --target conformance >> "$build/cmake.log" 2>&1; } ||
  { tail -40 "$build/cmake.log"; echo "cpp http: the runner did not build"; exit 1; }
"$build/conformance" "$@"
