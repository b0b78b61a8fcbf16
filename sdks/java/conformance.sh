#!/usr/bin/env bash
# Java's conformance runner (sdks/conformance/run.sh calls it with the folders of cases and
# scenarios; DEEPX_URL is the gateway): builds the SDK and its runner into a temporary
# folder and prints `java http: N passed, N failed`. Exit 3: the JDK or gson is not installed.
set -uo pipefail
command -v javac > /dev/null || { echo "java: not run (javac is not installed)"; exit 3; }
[ -f "${GSON_JAR:-/usr/share/java/gson.jar}" ] || { echo "java: not run (gson is not installed)"; exit 3; }
here="$(cd "$(dirname "$0")" && pwd)"
out=$(mktemp -d "${TMPDIR:-/tmp}/deepx-java.XXXXXX")
trap 'rm -rf "$out"' EXIT
bash "$here/build.sh" "$out" > "$out/build.log" 2>&1 ||
  { cat "$out/build.log"; echo "java http: the runner did not build"; exit 1; }
java -cp "$(cat "$out/classpath")" dev.deepx.flow.conformance.Conformance "$@"
