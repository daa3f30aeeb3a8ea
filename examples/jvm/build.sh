#!/usr/bin/env bash
# Build the Maven project beside this script's link (a JVM example's service/ folder) into OUT_DIR
# (absolute): OUT_DIR/lib holds its jar and every dependency. Maven resolves from its default
# repository into ~/.m2; its own work goes under OUT_DIR/target. Each example links this one file
# as its service/build.sh, so its content keys both examples' build caches.
set -euo pipefail

out="${1:?usage: build.sh OUT_DIR (an absolute path)}"
case "$out" in
  /*) ;;
  *) echo "build.sh: OUT_DIR must be absolute, got '$out'" >&2; exit 2 ;;
esac

for tool in java:"a JDK 17 (apt-get install openjdk-17-jdk-headless)" javac:"a JDK 17 (apt-get install openjdk-17-jdk-headless)" mvn:"Maven (apt-get install maven)"; do
  if ! command -v "${tool%%:*}" >/dev/null; then
    echo "build.sh: ${tool%%:*} not found: install ${tool#*:}" >&2
    exit 3
  fi
done

cd "$(dirname "${BASH_SOURCE[0]}")"  # the link's folder, not this file's: the project to build
mvn -B -q -Dout="$out/target" -DskipTests package
mkdir -p "$out/lib"
cp "$out"/target/lib/*.jar "$out"/target/*.jar "$out/lib/"
rm -rf "$out/target"
