# Two commands set up and exercise rbjax on a fresh machine with only python3:
#   make demo   creates .venv if missing, installs rbjax with its extras, runs the tumbling-body demo
#   make test   runs the whole test suite in the same .venv
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test,plot]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/tumbling_body.py --out tumbling_body.png

test: $(STAMP)
	$(PY) -m pytest -q -n auto --dist worksteal

lint: $(STAMP)
	$(PY) -m pip install --quiet -e ".[dev]"
	$(VENV)/bin/ruff check rbjax tests examples benchmarks
	$(VENV)/bin/ruff format --check rbjax tests examples benchmarks
	$(VENV)/bin/pyright

bench: $(STAMP)
	$(PY) -m pip install --quiet -e ".[bench]"
	$(PY) benchmarks/free_body.py --json benchmarks/results/free_body.json
	$(PY) benchmarks/mechanisms.py --json benchmarks/results/mechanisms.json
	$(PY) benchmarks/gradients.py --sweep --json benchmarks/results/gradients.json

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
