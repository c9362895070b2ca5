# The two quickstart commands are `make demo` and `make test`; everything else supports them.
VENV ?= .venv
# Our own modules cache their bytecode (in __pycache__/, which git ignores) even where the
# environment says not to: each test starts dozens of cloud and host processes.
unexport PYTHONDONTWRITEBYTECODE
PY := $(VENV)/bin/python
UV := $(VENV)/bin/uv
STAMP := $(VENV)/.installed
# Every Python dependency (transitive too, test tools included) at one version with its hashes;
# pyproject.toml keeps the ranges. `make lock` rewrites it (docs/conventions.md).
LOCK := requirements.lock
LOCK_COMPILE := pip compile -q pyproject.toml --extra test --universal --generate-hashes \
	--custom-compile-command "make lock"

.PHONY: demo up test test-serial test-fast check gen bench-smoke bench system-deps install lock lock-check

## The venv, exactly as the lock says (extra packages removed), then amc editable without resolving
## anything (its dependencies are the lock's). Dependencies are compiled to bytecode as they are
## installed (uv does not by default): where PYTHONDONTWRITEBYTECODE is set, as on our CI
## machines, every process compiled SQLAlchemy, Alembic, pydantic… from source again, and a cloud
## replica took 5.3 s to import instead of 2.0 (a restart's outage, every test's subprocess).
install: $(STAMP)

$(STAMP): $(LOCK) pyproject.toml | $(UV)
	$(UV) pip sync -q --python $(PY) --require-hashes --compile-bytecode $(LOCK)
	$(UV) pip install -q --python $(PY) --no-deps --build-constraints $(LOCK) -e .
	touch $@

# uv itself, at the lock's version and hashes, installed by the venv's own pip.
$(UV):
	python3 -m venv $(VENV)
	awk '/^uv==/ {p=1; print; next} p && /^ +--hash/ {print; next} {p=0}' $(LOCK) \
		> $(VENV)/uv-requirement.txt
	$(PY) -m pip install -q --require-hashes -r $(VENV)/uv-requirement.txt

## Re-resolve the lock from pyproject.toml, keeping every pin that still fits its range.
## Move pins on purpose: make lock LOCK_ARGS=--upgrade (all) or LOCK_ARGS="--upgrade-package openai".
lock: | $(UV)
	$(UV) $(LOCK_COMPILE) $(LOCK_ARGS) -o $(LOCK)

## Fails when pyproject.toml changed without `make lock` (resolves a copy of the lock, needs PyPI).
## The copy is a file of its own per run, so checks of several worktrees sharing one venv do not
## overwrite each other's.
lock-check: | $(UV)
	@copy=$$(mktemp --suffix=.lock-check.txt) && trap 'rm -f "$$copy"' EXIT \
		&& cp $(LOCK) "$$copy" && $(UV) $(LOCK_COMPILE) -o "$$copy" \
		&& { diff -u $(LOCK) "$$copy" \
			|| { echo "$(LOCK) does not match pyproject.toml: run make lock" >&2; exit 1; }; }

node_modules/.package-lock.json: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error

system-deps:
	bash scripts/system_deps.sh

## Run the main job: the embedded stack (cloud + host + virtual phone + offline planner, SQLite,
## mTLS) runs "Turn on dark theme" and prints each step.
demo: install
	$(VENV)/bin/amc demo

## The whole embedded stack, left running, with the consoles.
up: install
	$(VENV)/bin/amc up

## The test suite: installs what it needs (PostgreSQL, Chromium, Node tools) and runs pytest on
## two xdist workers (the tests mostly wait on servers, processes and phones: two halve the wall
## time on a 2-core machine; more starve the fault suite's timing), then the benchmarks' smoke
## run alone (it pins processes to CPUs and measures them). `make test-serial`: one worker.
test: system-deps install node_modules/.package-lock.json
	$(VENV)/bin/pytest -n 2 --dist worksteal --ignore=tests/bench --durations=15
	$(VENV)/bin/pytest tests/bench --durations=5

test-serial: system-deps install node_modules/.package-lock.json
	$(VENV)/bin/pytest

## Every test that needs neither PostgreSQL nor a browser nor Node.js (marks: tests/support/lanes.py),
## on one pytest-xdist worker per core (the tests mostly wait on servers and phones).
test-fast: install
	$(VENV)/bin/pytest -m "not postgres and not browser and not node" -n auto --dist worksteal

## Static checks CI runs before the tests.
check: install node_modules/.package-lock.json lock-check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) scripts/gen_protos.py --check
	npx buf lint
	npx buf format --diff --exit-code
	bash scripts/buf_breaking.sh
	npx eslint examples/node-host tests/node eslint.config.js

gen: install
	$(PY) scripts/gen_protos.py

bench-smoke: install
	$(PY) -m bench --smoke

bench: install
	$(PY) -m bench
