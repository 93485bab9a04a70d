# Entry points (README): `make demo`, `make test`. As root on Debian bookworm.
PYTHON ?= python3
DEMO_LOCK ?= pins/locks/demo.lock

.PHONY: setup base demo test

# Install the tool (+ test deps), then start the Docker engine and the 127.0.0.1:5000 registry
# if they are not running (idempotent; `builder setup` does the same).
setup:
	$(PYTHON) -m pip install -e '.[test]'
	$(PYTHON) -m builder.infra

# The demo base image (debootstrap + offline venv with CPU torch), cached by recipe hash;
# prints 127.0.0.1:5000/demo/base@sha256:... Also fetches the wheels of the demo lock.
base:
	$(PYTHON) -m builder.baseimage --lock $(DEMO_LOCK)

# Everything missing (engine, registry, base image, demo repos, pins digest), then the whole flow.
demo: setup
	$(PYTHON) -m builder.cli demo

test:
	$(PYTHON) -m pytest -q -ra
