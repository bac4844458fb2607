# sandpod: `make run` brings up a local cluster with sandpod installed; `make test` runs every test.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
export KUBECONFIG ?= $(CURDIR)/.cluster/kubeconfig

.PHONY: venv cluster-build cluster-up cluster-down

# The project's Python environment (operator, gateway, tests, the cluster's NetworkPolicy enforcer).
venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

# Builds every cluster component once (Kubernetes, etcd, gVisor, CoreDNS, Helm); cached in ~/.cache/sandpod.
cluster-build:
	hack/cluster/build.sh

cluster-up: venv cluster-build
	hack/cluster/up.sh

cluster-down:
	hack/cluster/down.sh
