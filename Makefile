# Fresh-machine entry points (see README): `make run` and `make test`.
VENV ?= .venv
PYTHON ?= python3

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -e ".[dev]"
	touch $@

.PHONY: install run test lint
install: $(VENV)/.installed

run: $(VENV)/.installed
	$(VENV)/bin/farm run jobs/local.yaml

test: $(VENV)/.installed
	scripts/ensure-postgres.sh
	scripts/ensure-chromium.sh
	PYTEST=$(VENV)/bin/pytest scripts/run-tests.sh

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check farm tests bench
	$(VENV)/bin/mypy
