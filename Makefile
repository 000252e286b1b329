# One entry point for people and CI. Every target installs what it needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
SAMPLE_PLAN := --model llama-3.1-8b --ttft 500ms --tpot 50ms --rps 10 --input 512 --output 256

.PHONY: venv plan test test-unit lint bench cluster-bins cluster-up cluster-down demo clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

## plan: print a plan for a sample model (no cluster needed)
plan: venv
	$(BIN)/kvscale plan $(SAMPLE_PLAN)

## cluster-bins: build etcd, kube-*, kwok, helm from the Go module proxy; install prometheus; fetch the InferencePool CRD (cached)
cluster-bins:
	bash hack/build-cluster-bins.sh
	bash hack/fetch-inference-crd.sh

## test: every test, the real-cluster ones included
test: venv cluster-bins
	KVSCALE_CLUSTER_BINS="$$(bash hack/build-cluster-bins.sh 2>/dev/null | tail -n 1)" $(BIN)/pytest

## test-unit: the tests that need no cluster
test-unit: venv
	$(BIN)/pytest tests/unit

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: venv cluster-bins
	PYTHONPATH=. $(BIN)/python benchmarks/accuracy.py
	$(BIN)/python benchmarks/plan_speed.py
	$(BIN)/python benchmarks/simulate.py
	PYTHONPATH=. $(BIN)/python benchmarks/operator.py

## cluster-up / cluster-down: the test cluster in the background, for kubectl
cluster-up: venv cluster-bins
	KVSCALE_CLUSTER_BINS="$$(bash hack/build-cluster-bins.sh 2>/dev/null | tail -n 1)" $(BIN)/python -m tests.cluster.up

cluster-down: venv
	$(BIN)/python -m tests.cluster.up --down

## demo: cluster, chart, a sample under a load ramp; prints decisions, writes out/demo.png (~4 min)
demo: venv cluster-bins
	KVSCALE_CLUSTER_BINS="$$(bash hack/build-cluster-bins.sh 2>/dev/null | tail -n 1)" PYTHONPATH=. $(BIN)/python hack/demo.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
