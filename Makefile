# Entry points (README): `make demo`, `make test`. As root on Debian bookworm.
PYTHON ?= python3
DEMO_LOCK ?= pins/locks/demo.lock

.PHONY: setup base demo test real-repos

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

# Not a CI test: lock, build and check an image with real Megatron-LM and verl PR heads from local
# bare mirrors (MIRRORS=DIR holding megatron.git, verl.git, verl-recipe.git; see the script).
real-repos:
	@test -n "$(MIRRORS)" || { echo "usage: make real-repos MIRRORS=DIR"; exit 2; }
	$(PYTHON) benchmarks/real_repos.py --mirrors $(MIRRORS)
