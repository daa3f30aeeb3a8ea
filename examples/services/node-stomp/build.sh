#!/usr/bin/env bash
# Build the service into OUT_DIR: copy the sources and install the pinned dependencies there.
# Run it as: build.sh OUT_DIR, then start `node OUT_DIR/service.js [--variant naive|fixed]`.
set -euo pipefail

if [[ $# -ne 1 || "$1" != /* ]]; then
    echo "usage: build.sh OUT_DIR (an absolute path)" >&2
    exit 2
fi
out="$1"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

mkdir -p "$out"
cp "$here/service.js" "$here/package.json" "$here/schema.sql" "$out/"
cd "$out"
# npm reads npm_config_cache from the environment by itself; no lockfile, so nothing here records
# where the packages came from.
npm install --omit=dev --no-audit --no-fund --no-package-lock --loglevel=error
