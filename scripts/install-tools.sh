#!/usr/bin/env bash
# Tools the deployment tests need, installed when missing:
#   prometheus + promtool and docker-compose from Debian's packages,
#   chromium + chromium-driver from Debian's packages (tests/browser; selenium drives them),
#   wrk from Debian's packages (the single-job load in BENCHMARKS.md),
#   helm built from source with `go install` (pinned), into $(go env GOPATH)/bin,
#   jaeger (all-in-one, v2) built from source (pinned), into the same directory.
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.19.0}"
JAEGER_VERSION="${JAEGER_VERSION:-v1.76.0}"
missing=()
command -v prometheus >/dev/null || missing+=(prometheus)
command -v promtool >/dev/null || missing+=(prometheus)
command -v docker-compose >/dev/null || missing+=(docker-compose)
[[ -x /usr/bin/chromium ]] || missing+=(chromium)
[[ -x /usr/bin/chromedriver ]] || missing+=(chromium-driver)
command -v wrk >/dev/null || missing+=(wrk)
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "install-tools: please install ${missing[*]} (Debian packages; needs root)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

gobin="$(go env GOPATH)/bin"
if ! command -v helm >/dev/null && [[ ! -x "$gobin/helm" ]]; then
  echo "install-tools: building helm $HELM_VERSION with go install (a few minutes, once)" >&2
  go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi

# tests/integration/test_tracing.py runs it as a subprocess (OTLP in, query API out).
# `go install github.com/jaegertracing/jaeger/cmd/jaeger@v1.76.0` refuses the module
# (its go.mod has a replace directive), so the module is downloaded and built in place:
# several minutes on 2 cores, once; a ~120 MB binary.
if ! command -v jaeger >/dev/null && [[ ! -x "$gobin/jaeger" ]]; then
  echo "install-tools: building jaeger $JAEGER_VERSION with go build (several minutes, once)" >&2
  dir="$(cd /tmp && go mod download -json "github.com/jaegertracing/jaeger@$JAEGER_VERSION" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  (cd "$dir" && go build -o "$gobin/jaeger" ./cmd/jaeger)
fi
