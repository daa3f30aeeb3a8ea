#!/usr/bin/env bash
# Build the service into OUT_DIR: Python needs no compiling, so this copies the source there.
# Run it as: build.sh OUT_DIR, then start `python OUT_DIR/service.py [--variant naive|fixed]` with an
# interpreter that has stomp.py (9.x) and psycopg (3.x) installed.
set -euo pipefail

if [[ $# -ne 1 || "$1" != /* ]]; then
    echo "usage: build.sh OUT_DIR (an absolute path)" >&2
    exit 2
fi
out="$1"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

mkdir -p "$out"
cp "$here/service.py" "$here/schema.sql" "$out/"
