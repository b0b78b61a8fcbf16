#!/usr/bin/env bash
# Builds the Java SDK with the JDK's tools (javac, jar) and Debian's gson, into OUT (a folder
# of the caller's; never this one):
#   OUT/deepx-flow.jar      the library (it needs gson.jar beside it on the class path)
#   OUT/test-classes        the unit tests (src/test) and the conformance runner (src/conformance)
#   OUT/classpath           the class path to run them with (the jar, gson, JUnit)
#
#   bash sdks/java/build.sh OUT
# GSON_JAR and JUNIT_JAR name other jars than Debian's.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$(mkdir -p "$1" && cd "$1" && pwd)"
gson="${GSON_JAR:-/usr/share/java/gson.jar}"
junit="${JUNIT_JAR:-/usr/share/java/junit-platform-console-standalone.jar}"
rm -rf "$out/classes" "$out/test-classes"
javac -encoding UTF-8 --release 17 -Xlint:all -Werror -cp "$gson" -d "$out/classes" \
  $(find "$here/src/main/java" -name '*.java')
jar --create --file "$out/deepx-flow.jar" -C "$out/classes" .
sources=$(find "$here/src/conformance/java" -name '*.java')
classpath="$out/deepx-flow.jar:$gson"
if [ -f "$junit" ]; then  # (the tests only where JUnit is installed)
  sources="$sources $(find "$here/src/test/java" -name '*.java')"
  classpath="$classpath:$junit"
fi
javac -encoding UTF-8 --release 17 -cp "$classpath" -d "$out/test-classes" $sources
echo "$classpath:$out/test-classes" > "$out/classpath"
