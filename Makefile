# onceflow: developer entry points. `make demo` and `make test` work on a fresh machine:
# they create the virtualenv, fetch Kafka's jars, install PostgreSQL when missing, and
# start both on loopback (see `onceflow dev --help`).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup services tools demo test unit lint down clean

# The runtime (with its test dependencies), the sample workflows and the tools: three
# distributions, installed editable. Only the first goes into the application image.
$(STAMP): pyproject.toml tools/pyproject.toml examples/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]' -e ./examples -e './tools[plots]'
	touch $(STAMP)

setup: $(STAMP)

services: setup
	$(BIN)/onceflow dev up

demo: services
	$(BIN)/onceflow demo

# Prometheus/promtool, docker-compose and helm, for the deployment tests; chromium and
# chromium-driver (Debian's) for the browser tests.
tools:
	./scripts/install-tools.sh

# ruff, mypy, and the layer contract (import-linter: a module may import only from the
# layers below it; see [tool.importlinter] in pyproject.toml and docs/architecture.md).
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The whole suite: lint, then unit, integration and acceptance tests on the real
# services started above (their addresses exported so the tests use them).
test: services tools lint
	eval "$$($(BIN)/onceflow dev env)" && PATH="$$PATH:$$(go env GOPATH)/bin" $(BIN)/pytest

unit: setup
	$(BIN)/pytest tests/unit

down:
	-$(BIN)/onceflow dev down

clean: down
	rm -rf .onceflow $(VENV)
