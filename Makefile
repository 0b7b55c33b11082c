# The two commands of the project: `make run` (the main job on the embedded default) and
# `make test` (the test suite). Both set up everything they need on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
WORKDIR ?= workdir
CRAWL ?= sample
STAMP := $(VENV)/.installed

.PHONY: run test lint ui sample clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

sample: $(STAMP)
	$(BIN)/curate sample --out sample

# Build the sample corpus, materialize the whole graph on a SQLite Dagster instance in
# $(WORKDIR), print the source x stage report.
run: sample
	$(BIN)/curate run --workdir $(WORKDIR) --crawl $(CRAWL) --config sample/curate.json

test: $(STAMP)
	$(BIN)/ruff check stages curation_dagster tests bench
	$(BIN)/python -m pytest -q -m "not gpu" --timeout 900

lint: $(STAMP)
	$(BIN)/ruff check stages curation_dagster tests bench
	$(BIN)/mypy stages curation_dagster

# The Dagster UI on the same instance as `make run` (http://127.0.0.1:3000).
ui: $(STAMP)
	$(BIN)/curate ui --workdir $(WORKDIR)

clean:
	rm -rf $(WORKDIR) sample
