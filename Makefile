# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install sysdeps test unit demo bench fuzz lint ruff typecheck lint-imports deadcode corpus-score clean lab lab-install lab-score lab-synth

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# A plain path entry for the checkout (compat mode), not setuptools' import finder, which every Python
	# start imports (25 ms of a diagnose start-up measured); the default mode if compat is ever removed.
	$(PY) -m pip install -q -e '.[test]' --config-settings editable_mode=compat 2>/dev/null || $(PY) -m pip install -q -e '.[test]'
	# Bytecode written once here: with PYTHONDONTWRITEBYTECODE set (as in CI) nothing else writes it, and
	# every `rootrank diagnose` would compile the package's sources again (0.3 s of its start-up).
	$(PY) -m compileall -q ingest correlator > /dev/null
	touch $(STAMP)

# Ends by saying how to get `rootrank` on PATH (activate the venv, or pipx).
install: $(STAMP)
	@$(PY) -m correlator.tooling.path_hint

sysdeps:
	bash scripts/install-system-deps.sh

# The gates run first (each stops the build): lint (ruff), types (mypy), architecture (import-linter).
test: $(STAMP) sysdeps lint
	$(PY) -m pytest -q -p no:cacheprovider tests

unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

# The demo ends by saying how to get `rootrank` on PATH, as install does.
demo: $(STAMP)
	$(PY) -m correlator.tooling.demo

bench: $(STAMP) sysdeps
	$(PY) -m benchmarks.run

fuzz: $(STAMP)
	ROOTRANK_FUZZ_MESSAGES=10000 ROOTRANK_LONG_TESTS=1 $(PY) -m pytest -q tests/integration -k "fuzz or rebalances_mid_stream"

# ruff, mypy and import-linter, without the tests (rules and settings in pyproject.toml).
lint: ruff typecheck lint-imports

ruff: $(STAMP)
	$(VENV)/bin/ruff check ingest correlator tests benchmarks scripts lab

typecheck: $(STAMP)
	$(VENV)/bin/mypy

lint-imports: $(STAMP)
	$(VENV)/bin/lint-imports

# Code nothing seems to use (a review aid: faust hooks, pydantic validators and registered stories are
# reached by name and show up too; check with grep, tests and docs included, before removing anything).
deadcode: $(STAMP)
	$(VENV)/bin/vulture ingest correlator tests benchmarks scripts --min-confidence 60 | grep -v '^tests/' || true

corpus-score: $(STAMP)
	$(PY) scripts/score_corpus.py

# The fault lab (docs/lab.md): real jobs with one injected fault each, then rootrank scored on their logs.
# `make lab LAB=name,...` runs a subset (names or coverage items); LAB_FORCE=1 runs again what already ran.
LAB ?=
LAB_OUT ?= lab-out
LAB_ARGS := $(if $(LAB),--only $(LAB),) --out $(LAB_OUT)
LAB_STAMP := $(VENV)/.lab-stamp

$(LAB_STAMP): pyproject.toml lab/install.sh $(STAMP)
	PY=$(PY) bash lab/install.sh
	touch $(LAB_STAMP)

lab-install: $(LAB_STAMP)

lab: lab-install
	$(PY) -m lab run $(LAB_ARGS) $(if $(LAB_FORCE),--force,)
	$(PY) -m lab score $(LAB_ARGS)

lab-score: $(STAMP)
	$(PY) -m lab score $(LAB_ARGS)

# The outside test: an independent generator of large synthetic jobs (lab/synth, not built from the rules
# or the simulator), then rootrank scored on them. Not part of `make test` (minutes, not seconds).
SYNTH_OUT ?= /tmp/rootrank-synth
SYNTH_JOBS ?= 40
SYNTH_SEED ?= 1
lab-synth: $(STAMP)
	$(PY) -m lab.synth --out $(SYNTH_OUT) --jobs $(SYNTH_JOBS) --seed $(SYNTH_SEED) --quiet
	$(PY) -m lab.synth.score $(SYNTH_OUT)

clean:
	rm -rf $(VENV) build *.egg-info
