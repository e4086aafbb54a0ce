# The two commands that matter: `make demo` and `make test`. Both set up everything on a
# fresh machine (virtualenv, Kafka jars, Postgres, S3Proxy) and are safe to rerun.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: demo test install lint typecheck unit up down clean docs docs-serve

$(BIN)/es-agents: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

install: $(BIN)/es-agents

demo: install
	$(BIN)/es-agents dev up
	$(BIN)/es-agents demo

test: install
	bash scripts/test.sh

lint: install
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

typecheck: install
	$(BIN)/mypy es_agents projectors examples tests

unit: install
	$(BIN)/python -m pytest -q tests/unit

# The documentation site (MkDocs, Material theme) into site/; --strict fails on a
# broken link, anchor or reference.
MKDOCS := NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(BIN)/mkdocs

docs: install
	$(MKDOCS) build --strict

docs-serve: install
	$(MKDOCS) serve --strict -a 127.0.0.1:8001

up: install
	$(BIN)/es-agents dev up

down: install
	$(BIN)/es-agents dev down

# The dev stack's data stays in its home (~/.es-agents/dev, or ES_AGENTS_DEV_HOME).
clean: down
	rm -rf $(VENV)
