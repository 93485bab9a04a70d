"""Stamp an installed component with its provenance: <dist-info>/BUILDER_PROVENANCE.json, added to RECORD.

usage: stamp.py --prefix P --distribution D PROVENANCE_JSON
(PROVENANCE_JSON: {component, commit, tree, pr, url}, written by the tool into the context)
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import find_dist_info, record_hash, sha256_file, site_dirs  # noqa: E402

NAME = "BUILDER_PROVENANCE.json"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--distribution", required=True)
    parser.add_argument("provenance")
    args = parser.parse_args(argv)
    data = json.load(open(args.provenance))
    missing = sorted({"component", "commit", "tree", "pr", "url"} - set(data))
    if missing:
        raise SystemExit(f"{args.provenance}: missing {missing}")
    info = find_dist_info(args.distribution, site_dirs(args.prefix))
    record = info / "RECORD"
    stamp = info / NAME
    stamp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    rows = [r for r in csv.reader(io.StringIO(record.read_text())) if r and r[0] != f"{info.name}/{NAME}"]
    rows.append([f"{info.name}/{NAME}", record_hash(sha256_file(stamp)), str(stamp.stat().st_size)])
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    record.write_text(out.getvalue())
    print(f"stamped {info}: {data['component']} {data['commit']}")


if __name__ == "__main__":
    main()
