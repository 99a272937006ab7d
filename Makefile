# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install sysdeps test unit demo bench fuzz lint ruff typecheck lint-imports deadcode corpus-score clean lab-synth

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

install: $(STAMP)

sysdeps:
	bash scripts/install-system-deps.sh

# The gates run first (each stops the build): lint (ruff), types (mypy), architecture (import-linter).
test: install sysdeps lint
	$(PY) -m pytest -q -p no:cacheprovider tests

unit: install
	$(PY) -m pytest -q tests/unit

demo: install
	$(PY) -m correlator.tooling.demo

bench: install sysdeps
	$(PY) -m benchmarks.run

fuzz: install
	ROOTRANK_FUZZ_MESSAGES=10000 ROOTRANK_LONG_TESTS=1 $(PY) -m pytest -q tests/integration -k "fuzz or rebalances_mid_stream"

# ruff, mypy and import-linter, without the tests (rules and settings in pyproject.toml).
lint: ruff typecheck lint-imports

ruff: install
	$(VENV)/bin/ruff check ingest correlator tests benchmarks scripts

typecheck: install
	$(VENV)/bin/mypy

lint-imports: install
	$(VENV)/bin/lint-imports

# Code nothing seems to use (a review aid: faust hooks, pydantic validators and registered stories are
# reached by name and show up too; check with grep, tests and docs included, before removing anything).
deadcode: install
	$(VENV)/bin/vulture ingest correlator tests benchmarks scripts --min-confidence 60 | grep -v '^tests/' || true

corpus-score: install
	$(PY) scripts/score_corpus.py

# The outside test: an independent generator of large synthetic jobs (lab/synth, not built from the rules
# or the simulator), then rootrank scored on them. Not part of `make test` (minutes, not seconds).
SYNTH_OUT ?= /tmp/rootrank-synth
SYNTH_JOBS ?= 40
SYNTH_SEED ?= 1
lab-synth: install
	$(PY) -m lab.synth --out $(SYNTH_OUT) --jobs $(SYNTH_JOBS) --seed $(SYNTH_SEED) --quiet
	$(PY) -m lab.synth.score $(SYNTH_OUT)

clean:
	rm -rf $(VENV) build *.egg-info
