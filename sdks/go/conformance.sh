#!/usr/bin/env bash
# Go's conformance runner (sdks/conformance/run.sh calls it with the folders of cases and
# scenarios; DEEPX_URL is the gateway): builds cmd/conformance offline and prints
# `go http: N passed, N failed`. Exit 3: Go is not installed.
set -uo pipefail
command -v go > /dev/null || { echo "go: not run (go is not installed)"; exit 3; }
here="$(cd "$(dirname "$0")" && pwd)"
bin=$(mktemp -d "${TMPDIR:-/tmp}/deepx-go.XXXXXX")
trap 'rm -rf "$bin"' EXIT
(cd "$here" && GOFLAGS=-mod=mod GOPROXY=off go build -o "$bin/conformance" ./cmd/conformance) ||
  { echo "go http: the runner did not build"; exit 1; }
"$bin/conformance" "$@"
