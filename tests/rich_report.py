"""A report with what a cluster run adds to the demo report (processes, census, JIT entries, a replay bundle, a
node, a Slurm step), each with a planted value a page test looks for."""
from __future__ import annotations

from typing import Any

from builder.core.records import Evidence, GateResult, NodeFacts, Report, SlurmFacts, SqshFacts
from builder.lock import record as lock_record
from builder.report import document
from tests.fixture_types import MakeReportInputs

PROCESS = {"pid": 41, "ppid": 1, "name": "python", "argv": ["python", "-m", "tinyrl.main_ppo"], "mnt_ns": "4026532",
           "modules": {"tinyrl": "/opt/venv/tinyrl/__init__.py"}, "libs": 3, "complete": True, "status": "pass",
           "node": "n1"}
CENSUS = {"nodes": {"n1": {"seen": 3, "recorded": 2, "unrecorded": [{"pid": 77, "exe": "/usr/bin/planted-helper"}]}}}
JIT = {"entries": [{"kernel": "planted_kernel_k1", "compiler": "triton", "origin": "compiled during the run"}]}
REPLAY = {"differs": True, "step": 2, "kind": "logprobs", "count": 5, "first": [{"position": 9}],
          "file": "replay/rl_step.json"}


def rich_report(report_inputs: MakeReportInputs) -> Report:
    """The demo report with what a cluster run adds: processes, census, JIT entries, a replay bundle, nodes."""
    pins, sources, built, result = report_inputs()
    assert result is not None

    def more(g: GateResult) -> GateResult:
        if g.name != "rl_step":
            return g
        extra: dict[str, Any] = {"processes": [PROCESS], "census": CENSUS, "jit": JIT, "replay": REPLAY}
        return g.model_copy(update={"evidence": Evidence.model_validate({**g.evidence.model_dump(), **extra})})

    facts = SlurmFacts(runner="slurm", engine="slurm 23.02", cluster="demo", job_id="812", partition="debug",
                        nodes=[NodeFacts(name="n1", sqsh_sha256="ab" * 32, sqsh_path="/local/n1/x.sqsh", staged="filled",
                                         check={"seconds": 1.5, "step": "812.0"})],
                        sqsh=SqshFacts(path="/shared/x.sqsh", sha256="ab" * 32),
                        gates={"rl_step": {"job_id": "812", "step": "812.3", "node": "n1", "state": "COMPLETED",
                                           "exit_code": 0, "seconds": 4.2}})
    acceptance = result.model_copy(update={"gates": [more(g) for g in result.gates], "where": facts})
    seen = {"checked": True, "net": ["lo"], "mountinfo": ["1 0 0:1 / / rw - overlay overlay rw"] * 2, "problems": []}
    built = built.model_copy(update={"isolation": seen}) if built else None  # the build's BUILD-ENV record
    return document.make_report(pins, lock_record.of(pins), sources, built, acceptance)
