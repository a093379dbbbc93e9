PYTHON ?= python3
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export WANDB_MODE ?= offline
export TAPS_DATA_DIR ?= $(abspath ../shared/data)

.PHONY: setup quickstart test lint

setup:
	PYTHON=$(PYTHON) bash scripts/setup.sh

## Train a small `balanced` drafter on the default target on CPU (a few minutes).
quickstart: setup
	bash scripts/quickstart.sh

## Install what is missing, then run the whole test suite.
test: setup
	$(PYTHON) -m ruff check .
	$(PYTHON) -m pytest --durations=15 -q

lint:
	$(PYTHON) -m ruff check .
