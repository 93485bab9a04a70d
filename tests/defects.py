"""The demo's planted defects that run both under Docker (tests/test_accept.py) and through --slurm
(tests/test_cluster_demo.py): (component, demo PR) -> the gate that must fail and words of its reason. Both
files assert these same words, so the Slurm side need not run the Docker gate again."""
from __future__ import annotations

from typing import Any

BATCH_INVARIANCE_OFF = ("vllm", 12)     # zero_update: a step's diff is not exactly 0.0
SKIPPED_WEIGHT_RELOAD = ("vllm", 13)    # rl_step: step 2 runs on stale weights
SLOW_EXACT_PATH = ("vllm", 14)          # performance: exact, but the aligned arm is slow
SLIGHTLY_SLOWER_PATH = ("vllm", 16)     # performance: exact and about 1.2x slower: it must still pass
# escapes from the per-process audit, each by its own mechanism (the gate's census names the process): the
# rollout worker is a fresh interpreter started without the job's variables / started with python -S (never
# loads the start-up hook) / deletes its own process record. Any recipe gate fails; each test runs one.
ESCAPE_WITHOUT_VARIABLES = ("verl", 39)
ESCAPE_WITHOUT_SITE = ("verl", 40)
ESCAPE_RECORD_DELETED = ("verl", 41)
ESCAPES = (ESCAPE_WITHOUT_VARIABLES, ESCAPE_WITHOUT_SITE, ESCAPE_RECORD_DELETED)
# issue 47's escapes, by content (the census names each process): the worker on a renamed copy of the interpreter
# (class 1), a server that turns PR_SET_DUMPABLE off (class 2: unreadable), a record written by the fork handler
# before the child execs python -S (class 3). Under Docker, PR 49's class 3 runs within PR 50 (below).
ESCAPE_RENAMED_INTERPRETER = ("verl", 47)
ESCAPE_UNREADABLE = ("verl", 48)
ESCAPE_EXEC_AFTER_RECORD = ("verl", 49)
CONTENT_ESCAPES = (ESCAPE_RENAMED_INTERPRETER, ESCAPE_UNREADABLE)
# the four classes at once (tinyrl PR 50): helpers beside the engine, each named by its role (one of its arguments) ->
# its class in the census (why it is an interpreter, or unreadable) and words of its failure line
ESCAPES_AT_ONCE = ("verl", 50)
HELPERS: dict[str, tuple[str, str | None, str]] = {
    "tokenizer-warmup": ("python", "loader", "ran a Python interpreter, and it left no process record"),  # class 1
    "key-holder": ("unreadable", None, "could not be read (its exe"),  # class 2
    "session-daemon": ("python", "identity", "after its record (that program, mark "),  # class 3
    "probe": ("python", "identity", "ran a Python interpreter, and it left no process record"),  # class 4: 40 ms
}
UNRECORDED = "ran a Python interpreter, and "   # in each escape's reason, after the node, pid, executable, argv

REASONS: dict[tuple[str, int], tuple[str, str]] = {
    BATCH_INVARIANCE_OFF: ("zero_update", "expected exactly 0.0"),
    SKIPPED_WEIGHT_RELOAD: ("rl_step", "step 2:"),
    SLOW_EXACT_PATH: ("performance", "is < min_ratio 0.2"),  # the sequential rule's upper bound
    ESCAPE_WITHOUT_VARIABLES: ("zero_update", " -m tinyrl.rollout_server --port "),
    ESCAPE_WITHOUT_SITE: ("rl_step", " -S -c import json, sys; sys.path[:] = json.loads(sys.argv[1]);"),
    ESCAPE_RECORD_DELETED: ("control", " -m tinyrl.main_ppo "),  # the forked worker: its argv is the trainer's
    ESCAPE_RENAMED_INTERPRETER: ("zero_update", "/rollout-engine -c import json, sys;"),
    ESCAPE_UNREADABLE: ("rl_step", "could not be read (its exe"),
    ESCAPE_EXEC_AFTER_RECORD: ("control", "after its record (that program, mark "),
    ESCAPES_AT_ONCE: ("zero_update", "per-process provenance: census: node "),
}


def without_performance(data: dict[str, Any]) -> None:
    """A pins edit for tests about something else than speed (concurrency, nightly, run, publish): the performance
    gate's six interleaved runs are most of an acceptance's CPU time. Its own pass and fail tests keep it
    (the demo acceptance, the slow PR under Docker and through --slurm)."""
    acceptance = data["acceptance"]
    acceptance.pop("performance", None)
    acceptance["required_gates"] = [g for g in acceptance["required_gates"] if g != "performance"]
