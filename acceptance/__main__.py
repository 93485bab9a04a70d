"""`python -m acceptance gate <name> --settings <json>`: run one gate, print its GateResult JSON as the last
stdout line. The recipe's own output goes to stderr."""
import argparse
import json
import math
import sys
import time
import traceback

from acceptance.defaults import GATES, METRICS


def run_gate(name: str, settings: dict) -> dict:
    start = time.time()
    log = ""
    if name == "provenance":
        from acceptance import provenance

        status, reason, evidence = provenance.check(settings)
    else:
        from acceptance import decide, recipe

        metrics = {**METRICS, **(settings.get("metrics") or {})}
        run, facts, log = recipe.run(settings, name)
        status, reason, evidence = decide.DECISIONS[name](run, int(settings["steps"]), metrics)
        evidence["run"] = facts
    evidence["seconds"] = round(time.time() - start, 3)
    return {"name": name, "status": status, "reason": reason, "evidence": evidence, "log": log}


def plain(value):
    """JSON-safe copy: NaN and infinities become strings ('nan', 'inf') so every reader can load the line."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m acceptance")
    sub = parser.add_subparsers(dest="command", required=True)
    gate = sub.add_parser("gate", help="run one gate")
    gate.add_argument("name", choices=GATES)
    gate.add_argument("--settings", required=True, help="settings as JSON, or @file")
    args = parser.parse_args(argv)
    text = args.settings
    if text.startswith("@"):
        with open(text[1:]) as fh:
            text = fh.read()
    try:
        result = run_gate(args.name, json.loads(text))
    except Exception as err:  # noqa: BLE001 - a crashing gate is a failed gate, with its traceback
        tail = traceback.format_exc()[-4000:]
        result = {"name": args.name, "status": "fail", "reason": f"gate crashed: {err.__class__.__name__}: {err}",
                  "evidence": {}, "log": tail}
    sys.stdout.flush()
    print(json.dumps(plain(result), default=str, allow_nan=False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
