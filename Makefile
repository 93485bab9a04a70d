# Entry points (README): `make demo`, `make test` (CI; `make test-fast` skips docker and slow tests).
# As root on Debian bookworm.
# Everything runs in a project venv (.venv), made with Debian's python3 if no venv is active:
# Debian's own python refuses `pip install` (PEP 668).
VENV ?= $(if $(VIRTUAL_ENV),$(VIRTUAL_ENV),$(CURDIR)/.venv)
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
# The demo base's CPU torch wheel: on this machine kind it lies in /opt/wheels (pip's config names that folder,
# and the tool never reads what pip's config says to resolve from); elsewhere set BUILDER_FIND_LINKS or
# BUILDER_INDEX_URL to where your site keeps it (docs/settings.md).
export BUILDER_FIND_LINKS ?= $(wildcard /opt/wheels)

.PHONY: setup venv venv-test base demo demo-arm64 demo-cluster cluster-stop test test-fast lint docs real-repos

# The tool's own dependencies (what `make demo` needs); the test extras (torch, linters) only for tests.
venv: $(STAMP)
$(STAMP): pyproject.toml
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install -q --disable-pip-version-check -e .
	touch $(STAMP)

venv-test: $(TEST_STAMP)
$(TEST_STAMP): $(STAMP)
	$(PYTHON) -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $(TEST_STAMP)

# Start the Docker engine and the 127.0.0.1:5000 registry if they are not running (idempotent).
setup: venv
	$(PYTHON) -m builder setup

# The demo base image (debootstrap + offline venv with CPU torch), cached by recipe hash.
base: setup
	$(PYTHON) -m demo base

# Everything missing (engine, registry, base image, demo repos, local pins), then the whole flow;
# prints each phase's time at the end.
demo:
	@start=$$(date +%s); $(MAKE) --no-print-directory setup || exit $$?; \
	$(PYTHON) -m demo run --setup-seconds $$(( $$(date +%s) - start ))

# After `make demo`: the demo image for linux/arm64 (its own base and lock: torch 2.10.0, the newest aarch64 CPU wheel),
# built and accepted emulated through qemu-user-static's binfmt (provenance only: the recipe gates need a native arm64
# node), then one signed index of both accepted digests (demo/arm64.py). Slow: outside `make demo` and `make test`.
demo-arm64:
	@$(MAKE) --no-print-directory setup || exit $$?; $(PYTHON) -m demo.arm64

# The whole cluster flow after `make demo`'s set-up: a two-node Slurm cluster (demo/cluster.py; it installs
# slurm-wlm, slurmdbd, munge, mariadb-server and charliecloud-runtime with apt-get when missing, as setup installs
# Docker), the candidate exported to .sqsh, every gate as a Slurm step across both nodes (the rollout on n2), publish.
demo-cluster:
	@start=$$(date +%s); $(MAKE) --no-print-directory setup || exit $$?; \
	$(PYTHON) -m demo run --slurm --setup-seconds $$(( $$(date +%s) - start ))

# The demo cluster's daemons keep running after demo-cluster (the next run reuses them): this stops them.
cluster-stop: venv
	$(PYTHON) -m demo.cluster stop

# The generated parts of the docs, written again from the code: docs/settings.md (builder/core/options.py) and
# DESIGN.md's record tables (builder/core/records.py); tests/unit/test_docs.py and test_architecture.py check them.
docs: venv
	$(PYTHON) -m tests.gendocs

lint: venv-test
	$(PYTHON) -m ruff check builder acceptance demo tests benchmarks
	$(PYTHON) -m mypy

# pytest-xdist workers, one per group of slow tests (tests/budget.py: engine, release, cluster, apart); the fast
# tests fill the gaps. Most of a slow test's time is waiting (containers, Slurm, registries), so four share the
# two cores. TEST_WORKERS=0 runs them in this one process.
# The checkout's bytecode first: with PYTHONDONTWRITEBYTECODE set, every builder process the tests start would
# compile the modules it imports again (0.2 s each, hundreds of processes); compileall writes them regardless.
TEST_WORKERS ?= 4
test: setup venv-test
	$(PYTHON) -m compileall -q builder acceptance demo tests > /dev/null
	$(PYTHON) -m pytest -q -ra $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup)

# The unit lane: no Docker engine, no pip/torch/subprocess builds (markers in pyproject.toml); under 2 minutes.
# tests/unit holds only such tests (tests/budget.py refuses a docker/slow one there); the few fast tests of
# mixed files in tests/integration run here too.
test-fast: venv-test
	$(PYTHON) -m pytest -q -ra -m "not docker and not slow"

# Not a CI test: lock, build and check an image with real Megatron-LM and verl PR heads from local
# bare mirrors (MIRRORS=DIR holding megatron.git, verl.git, verl-recipe.git; see the script); VLLM_VERSION=X.Y.Z
# picks the vLLM release (default: the newest on pip's configured index).
real-repos: setup
	@test -n "$(MIRRORS)" || { echo "usage: make real-repos MIRRORS=DIR [VLLM_VERSION=X.Y.Z]"; exit 2; }
	$(PYTHON) benchmarks/real_repos.py --mirrors $(MIRRORS) $(if $(VLLM_VERSION),--vllm-version $(VLLM_VERSION))
