# Two commands set up and exercise rbjax on a fresh machine with only python3:
#   make demo   creates .venv if missing, installs rbjax with its extras, runs the tumbling-body demo
#   make test   runs the whole test suite in the same .venv
# and three more that CI runs: make lint (ruff, ruff format, pyright), make docs (the site,
# strict), make check (lint + docs + test: what .ci/run runs).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint docs check bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test,plot,dev,docs]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/tumbling_body.py --out tumbling_body.png

test: $(STAMP)
	$(PY) -m pytest -q -n auto --dist worksteal

lint: $(STAMP)
	$(VENV)/bin/ruff check rbjax tests examples benchmarks
	$(VENV)/bin/ruff format --check rbjax tests examples benchmarks
	$(VENV)/bin/pyright

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

check: lint docs test

bench: $(STAMP)
	$(PY) -m pip install --quiet -e ".[bench]"
	$(PY) benchmarks/free_body.py --json benchmarks/results/free_body.json
	$(PY) benchmarks/mechanisms.py --json benchmarks/results/mechanisms.json
	$(PY) benchmarks/gradients.py --sweep --json benchmarks/results/gradients.json
	$(PY) benchmarks/monte_carlo.py --json benchmarks/results/monte_carlo.json

clean:
	rm -rf $(VENV) .pytest_cache build site *.egg-info
