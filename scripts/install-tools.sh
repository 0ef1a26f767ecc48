#!/usr/bin/env bash
# Tools the deployment tests need, installed when missing:
#   prometheus + promtool and docker-compose from Debian's packages,
#   chromium + chromium-driver from Debian's packages (tests/browser; selenium drives them),
#   helm built from source with `go install` (pinned), into $(go env GOPATH)/bin.
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.19.0}"
missing=()
command -v prometheus >/dev/null || missing+=(prometheus)
command -v promtool >/dev/null || missing+=(prometheus)
command -v docker-compose >/dev/null || missing+=(docker-compose)
[[ -x /usr/bin/chromium ]] || missing+=(chromium)
[[ -x /usr/bin/chromedriver ]] || missing+=(chromium-driver)
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
