# One entry point for people and CI. Every target installs what it needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
SAMPLE_PLAN := --model llama-3.1-8b --ttft 500ms --tpot 50ms --rps 10 --input 512 --output 256

.PHONY: venv plan test test-unit lint docs-check docs-update bench cluster-bins cluster-up cluster-down demo conformance image image-push clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

## plan: print a plan for a sample model (no cluster needed)
plan: venv
	$(BIN)/kvscale plan $(SAMPLE_PLAN)

## cluster-bins: build etcd, kube-*, kwok, helm, prometheus, promtool from the Go module proxy; fetch the InferencePool, LeaderWorkerSet and Prometheus Operator CRDs (cached)
cluster-bins:
	bash hack/build-cluster-bins.sh
	bash hack/fetch-inference-crd.sh
	bash hack/fetch-lws-crd.sh
	bash hack/fetch-prometheus-operator-crds.sh

## test: every test, the real-cluster ones included: TEST_WORKERS processes (pytest-xdist), each
## running whole files and starting its own cluster for the first cluster file it gets (the
## cluster tests mostly wait: 4 on 2 cores, about 4 GiB in all)
TEST_WORKERS ?= 4
test: venv cluster-bins
	KVSCALE_CLUSTER_BINS="$$(bash hack/build-cluster-bins.sh 2>/dev/null | tail -n 1)" $(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile

## test-unit: the tests that need no cluster
test-unit: venv
	$(BIN)/pytest tests/unit

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

## docs-check: rerun every command whose output or figures README.md and docs/ quote (the markers
## `<!-- docs-check ... -->`), fail naming the file, line and what differs (~2 min); docs-update rewrites them
docs-check: venv
	$(BIN)/python hack/docs_check.py

docs-update: venv
	$(BIN)/python hack/docs_check.py --update

bench: venv cluster-bins
	PYTHONPATH=. $(BIN)/python benchmarks/accuracy.py
	$(BIN)/python benchmarks/plan_speed.py
	$(BIN)/python benchmarks/plan_trace_speed.py
	$(BIN)/python benchmarks/simulate.py
	PYTHONPATH=. $(BIN)/python benchmarks/operator.py

## cluster-up / cluster-down: the test cluster in the background, for kubectl
cluster-up: venv cluster-bins
	KVSCALE_CLUSTER_BINS="$$(bash hack/build-cluster-bins.sh 2>/dev/null | tail -n 1)" $(BIN)/python -m tests.cluster.up

cluster-down: venv
	$(BIN)/python -m tests.cluster.up --down

## demo: cluster, chart, a sample under a load ramp; prints decisions, writes out/demo.png (~4 min;
## tests/cluster/test_demo.py runs it with a 90 s ramp)
demo: venv cluster-bins
	KVSCALE_CLUSTER_BINS="$$(bash hack/build-cluster-bins.sh 2>/dev/null | tail -n 1)" PYTHONPATH=. $(BIN)/python hack/demo.py

## conformance: kvscale's engine arguments for every sample and catalog model against vLLM 0.11.0's
## and SGLang 0.5.23's argument definitions, read from their wheels (downloaded once, ~0.5 GB; not in make test)
WHEELS := $(HOME)/.cache/kvscale/wheels
conformance: venv
	mkdir -p $(WHEELS)
	ls $(WHEELS)/vllm-0.11.0-*.whl >/dev/null 2>&1 || $(BIN)/pip download -q --no-deps vllm==0.11.0 -d $(WHEELS)
	ls $(WHEELS)/sglang-0.5.23-*.whl >/dev/null 2>&1 || $(BIN)/pip download -q --no-deps sglang==0.5.23 -d $(WHEELS)
	$(BIN)/python hack/engine_conformance.py $$(ls $(WHEELS)/vllm-0.11.0-*.whl) $$(ls $(WHEELS)/sglang-0.5.23-*.whl)

## image / image-push: build (push) the operator image from the Dockerfile with docker, podman or
## buildah, whichever is on PATH; IMAGE names it (set the chart's image.repository and image.tag to match)
IMAGE ?= ghcr.io/kvscale/kvscale:0.1.0
BUILDER = $$(command -v docker || command -v podman || command -v buildah || \
	{ echo "make image: needs docker, podman or buildah on PATH (none found)" >&2; echo false; })
image:
	$(BUILDER) build -t $(IMAGE) .

image-push: image
	$(BUILDER) push $(IMAGE)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
