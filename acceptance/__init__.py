"""Acceptance suite that runs INSIDE the built image (stdlib only).

`python -m acceptance gate <name> --settings <json>` runs one gate and prints its GateResult as JSON
on the last stdout line. Gates: provenance, zero_update, rl_step, control.
"""
from acceptance.defaults import GATES  # noqa: F401
