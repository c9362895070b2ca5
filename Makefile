# The two quickstart commands are `make demo` and `make test`; everything else supports them.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo up test check gen bench-smoke bench system-deps install

install: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

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

## The test suite: installs what it needs (PostgreSQL, Chromium, Node tools) and runs pytest.
test: system-deps install node_modules/.package-lock.json
	$(VENV)/bin/pytest

## Static checks CI runs before the tests.
check: install node_modules/.package-lock.json
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) scripts/gen_protos.py --check
	npx buf lint
	npx buf format --diff --exit-code
	bash scripts/buf_breaking.sh

gen: install
	$(PY) scripts/gen_protos.py

bench-smoke: install
	$(PY) -m bench --smoke

bench: install
	$(PY) -m bench
