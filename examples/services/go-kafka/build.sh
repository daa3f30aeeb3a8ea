#!/usr/bin/env bash
# Build orders-go into OUT_DIR (absolute). Modules come from GOMODCACHE (or the
# proxy GOPROXY names); nothing is written inside the source tree.
set -euo pipefail

out="${1:?usage: build.sh OUT_DIR (an absolute path)}"
case "$out" in
  /*) ;;
  *) echo "build.sh: OUT_DIR must be absolute, got '$out'" >&2; exit 2 ;;
esac

cd "$(dirname "${BASH_SOURCE[0]}")"
mkdir -p "$out"

export CGO_ENABLED=0
# -mod=readonly: never rewrite go.mod/go.sum; -modcacherw: a shared module
# cache stays deletable; -buildvcs=false: no VCS stamp (the tree may be a copy).
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=readonly -modcacherw -buildvcs=false"

go mod download
go build -trimpath -o "$out/orders-go" .
