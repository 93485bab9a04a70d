"""Test time budgets (hooks imported by conftest.py).

A test is `slow` when marked so or when it uses a fixture that builds, accepts or starts something
(SLOW_FIXTURES): those are shared per session, so the first user pays. Each kind has a budget per
test (setup + call + teardown); `make test` as a whole has SESSION_BUDGET_S. At the end pytest prints
where the time went: per kind, the shared fixtures' set-ups, the slowest tests and every test over
its budget, and every test over 60 s whose docstring does not say why (BUILDER_TEST_BUDGET=strict makes those a
failure). `pytest -m "not slow"` is the quick loop.
Under pytest-xdist the controller prints it: the per-kind seconds add up both workers, the session line is wall time.
"""
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SLOW_FIXTURES = {"base_image", "demo_image", "build_variant", "demo_accepted", "second_engine", "staged_demo",
                 "stamped_pins", "hatch_locked", "demo_pins", "slurm_cluster", "slurm_fleet"}
# `make test` runs pytest-xdist workers with --dist loadgroup. Each group runs on one worker; the session fixtures
# that can be shared (tests/shared.py: the base image, the demo pins, image, acceptance and staged push) are made
# once for all workers. "apart": the fault matrix on parts of its own (its own dockerd, registry and disk).
# "cluster": the two-node Slurm cluster, its fleet and every cluster test (one cluster per host: its ports). "engine"
# and "release": the other
# slow or Docker tests on the shared engine and registry, split by file so that the two take about as long. The
# fast tests go to whichever worker is free. A group's tests run one after another: the longest group bounds
# `make test` (the fresh-clone run's table lists each group's seconds).
# with the fault matrix, for balance: tests that build on their own (bisect's candidates, the identity cold build,
# the compiler cache's cold, warm and uncached builds, the lock failures' base without torch)
APART = ("tests/integration/test_fault_matrix.py", "tests/integration/test_bisect.py",
         "tests/integration/test_identity_build.py", "tests/integration/test_ccache.py",
         "tests/integration/test_lock_failures.py")
GROUPS = {"apart": APART,
          # for balance (the cluster tests wait on Slurm a lot): test_concurrency's four Docker nightlies, and the
          # Docker checkpoint tests, whose model and defect images (#23, #24) test_cluster_checkpoint reuses here
          "cluster": ("tests/integration/test_cluster_", "tests/integration/test_concurrency.py",
                      "tests/integration/test_accept_checkpoint.py"),
          "release": tuple(f"tests/integration/test_{name}.py" for name in (
              "publish", "publish_lock_edit", "promote", "sqsh", "nightly", "run", "reproducible", "second_engine", "gc",
              "trusted_keys", "trip_ups", "install", "publish_kills", "multiarch_publish",
              "registries", "layer_cache"))}
# Warnings are errors (pyproject.toml). The integration tests drive real engines, registries and daemons through
# the Docker SDK and subprocess pipes; the SDK leaves a refused connection's socket, and a killed child's pipe, to
# the garbage collector, which reports them at a random later test. Those two (and only there) stay warnings.
LEAKS = ("default::ResourceWarning", "default::pytest.PytestUnraisableExceptionWarning")
BUDGET_S = {"slow": 240.0, "docker": 60.0, "fast": 5.0}
SESSION_BUDGET_S = 15 * 60

_spent: dict[str, dict[str, float]] = {}  # nodeid -> {phase: seconds}
_cpu: dict[str, dict[str, float]] = {}    # nodeid -> {phase: the host's busy CPU seconds}
_kind: dict[str, str] = {}
_said_why: dict[str, bool] = {}  # nodeid -> its docstring or its module's says "Over 60 s" and why
LONG_S = 60.0  # a test that spends more must say why in its docstring (or its module's): "Over 60 s (...): ..."
SLOWEST = 15
_started = time.monotonic()


def _cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole host, from /proc/stat (0, 0 where there is none)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


_cpu_start = _cpu_ticks()
TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def kind_of(item: pytest.Item) -> str:
    if item.get_closest_marker("slow"):
        return "slow"
    return "docker" if item.get_closest_marker("docker") else "fast"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which appends the group to the node ID
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
        kind = kind_of(item)
        group = next((g for g, files in GROUPS.items() if item.nodeid.startswith(files)), "engine")
        if group == "apart" or kind != "fast":
            item.add_marker(pytest.mark.xdist_group(group))

    for item in items:  # see LEAKS
        if item.nodeid.startswith("tests/integration/"):
            item.add_marker(pytest.mark.filterwarnings(*LEAKS))
    misplaced = [item.nodeid for item in items if item.nodeid.startswith("tests/unit/") and kind_of(item) != "fast"]
    if misplaced:  # tests/unit is the unit lane: no Docker, no subprocess builds (those go to tests/integration)
        raise pytest.UsageError(f"docker/slow tests under tests/unit (move them to tests/integration): {misplaced}")


def pytest_collection_finish(session: pytest.Session) -> None:
    """After xdist's hook: a group it did not append to the node ID would be split across workers silently."""
    if getattr(session.config.option, "loadgroup", False):
        lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
        if lost:
            raise pytest.UsageError(f"--dist loadgroup: {lost[0]} lost its xdist group (pytest >= 9.2: xdist #1386)")


def _host_cpu(item: pytest.Item, when: str) -> Iterator[None]:
    """The host's busy CPU seconds during a phase (all processes: engines, containers, Slurm jobs), kept with the
    report as `cpu_<phase>`. Run alone (-n 0) it is the test's own CPU cost; under xdist it counts the others too."""
    busy = _cpu_ticks()[0]
    yield
    item.user_properties.append((f"cpu_{when}", (_cpu_ticks()[0] - busy) / TICKS_PER_S))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    return (yield from _host_cpu(item, "setup"))


def says_why(item: pytest.Item) -> bool:
    """The test's docstring, or its module's, explains a run over LONG_S ("Over 60 s ...")."""
    docs = (getattr(getattr(item, "function", None), "__doc__", None), getattr(getattr(item, "module", None), "__doc__", None))
    return any(doc and "over 60 s" in " ".join(doc.split()).lower() for doc in docs)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    item.user_properties.append(("says_why", says_why(item)))
    return (yield from _host_cpu(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    return (yield from _host_cpu(item, "teardown"))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Also on the xdist controller, which collects nothing: the kind comes with the report's keywords."""
    spent = _spent.setdefault(report.nodeid, {})
    spent[report.when] = report.duration
    cpu = dict(report.user_properties).get(f"cpu_{report.when}")
    if isinstance(cpu, float):
        _cpu.setdefault(report.nodeid, {})[report.when] = cpu
    if report.when == "call":
        _said_why[report.nodeid] = dict(report.user_properties).get("says_why") is True
    _kind[report.nodeid] = "slow" if "slow" in report.keywords else "docker" if "docker" in report.keywords else "fast"


def over_budget() -> list[tuple[str, float, float]]:
    out = []
    for nodeid, phases in _spent.items():
        took, budget = sum(phases.values()), BUDGET_S[_kind.get(nodeid, "fast")]
        if took > budget:
            out.append((nodeid, took, budget))
    return sorted(out, key=lambda x: -x[1])


def long_without_reason() -> list[tuple[str, float]]:
    """Tests whose call (not the set-up, where the shared fixtures' first user builds them) passed LONG_S and whose
    docstrings do not say why."""
    return sorted(((n, p.get("call", 0.0)) for n, p in _spent.items()
                   if p.get("call", 0.0) > LONG_S and not _said_why.get(n, False)), key=lambda x: -x[1])


def pytest_terminal_summary(terminalreporter: object, exitstatus: int, config: pytest.Config) -> None:
    write = terminalreporter.write_line  # type: ignore[attr-defined]
    if not _spent or hasattr(config, "workerinput"):  # an xdist worker: the controller prints the table
        return
    total = time.monotonic() - _started
    write("== test phase timings ==")
    for kind in ("fast", "docker", "slow"):
        ids = [n for n in _spent if _kind.get(n, "fast") == kind]
        seconds = sum(sum(_spent[n].values()) for n in ids)
        write(f"  {kind:<8} {len(ids):5d} tests {seconds:8.1f} s  (budget {BUDGET_S[kind]:.0f} s per test)")
    groups: dict[str, list[float]] = {}
    for nodeid, phases in _spent.items():
        group = nodeid.rpartition("@")[2]
        if group in (*GROUPS, "engine"):  # a parameter may hold an "@" too ([image@sha256:...])
            groups.setdefault(group, []).append(sum(phases.values()))
    for group, times in sorted(groups.items()):
        write(f"  group {group:<8} {len(times):4d} tests {sum(times):8.1f} s  (one worker's)")
    setups = sorted(((p.get("setup", 0.0), n) for n, p in _spent.items() if p.get("setup", 0.0) > 5), reverse=True)
    for seconds, nodeid in setups[:8]:
        write(f"  set-up  {seconds:8.1f} s  {nodeid} (shared fixtures built here)")
    slowest = sorted(((sum(p.values()), n) for n, p in _spent.items()), reverse=True)[:SLOWEST]
    for seconds, nodeid in slowest:
        write(f"  slowest {seconds:8.1f} s  {nodeid}")
    late = over_budget()
    for nodeid, took, budget in late:
        write(f"  OVER BUDGET {took:.1f} s > {budget:.0f} s: {nodeid}")
    for nodeid, took in long_without_reason():
        write(f"  NO REASON {took:.1f} s > {LONG_S:.0f} s and its docstring does not say why (\"Over 60 s ...\"): {nodeid}")
    busy, all_ticks = (now - then for now, then in zip(_cpu_ticks(), _cpu_start, strict=True))
    if all_ticks:
        write(f"  cpu      {100 * busy / all_ticks:8.1f} %  of the host's {os.cpu_count()} cores busy")
    dump = Path(config.rootpath) / ".pytest_cache" / "test-times.json"  # every test's phases, for a later look
    dump.parent.mkdir(exist_ok=True)
    dump.write_text(json.dumps(_spent, indent=1, sort_keys=True))
    dump.with_name("test-cpu.json").write_text(json.dumps(_cpu, indent=1, sort_keys=True))
    workers = getattr(config.option, "numprocesses", None)
    write(f"  session  {total:8.1f} s  (budget {SESSION_BUDGET_S} s{'' if total <= SESSION_BUDGET_S else ', MISSED'})"
          + (f"  on {workers} xdist workers" if workers else ""))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("BUILDER_TEST_BUDGET") == "strict" and (over_budget() or long_without_reason()) and exitstatus == 0:
        session.exitstatus = 1
