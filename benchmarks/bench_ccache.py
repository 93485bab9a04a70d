"""Compiler cache on the demo native extension: touch one source file and rebuild (prints a table; not a test).

The demo's tinyengine._C is one small C file, so on a private copy of the demo stack it gets --units more
generated translation units (a commit on top of the pinned vllm-role commit), enough for compile time to show:
  grow        first build of the grown extension with an empty compiler cache (every unit compiles)
  touch       a commit that changes only a comment of csrc/_C.c (what touching a file is, in git), rebuilt
              with BUILDER_CCACHE=off and with the warm cache
  edit        a commit that changes code in one generated unit, rebuilt without and with the cache
Columns: seconds of tinyengine's install step (pip: compile, link, install), ccache hits/calls, manifest digest.
The digests of one tree must be the same with and without the cache.
usage: python benchmarks/bench_ccache.py [--units 8] [--functions 160]
"""
import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pygit2
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from builder.core.options import Settings  # noqa: E402
from builder.engine import client as engine  # noqa: E402
from builder.image import build, ccache, render  # noqa: E402
from builder.lock import record as lock_record
from builder.pins import model as pins_mod  # noqa: E402
from builder.sources import resolve as sources  # noqa: E402
from demo.prepare import prepare_demo, variant_pins  # noqa: E402

SETTINGS = Settings.from_env()


def unit(k: int, functions: int, salt: int = 0) -> bytes:
    lines = ["#include <stdint.h>"]
    for f in range(functions):
        lines.append(f"uint64_t unit{k}_fn{f}(const uint64_t *x, int n) {{ uint64_t h = {f + salt}u;"
                     f" for (int i = 0; i < n; i++) {{ h ^= x[i] * 0x9E3779B97F4A7C15ull; h = (h << 13) | (h >> 51);"
                     f" if (h % {f + 3}) h += x[(i * {f + 7}) % n]; }} return h; }}")
    return ("\n".join(lines) + "\n").encode()


def commit(repo: Any, parent: Any, files: dict[str, bytes], message: str, when: int, pr: int) -> pygit2.Commit:
    """A commit on `parent` with `files` (path -> bytes) written into its tree, the head of PR `pr`."""
    index = pygit2.Index()
    index.read_tree(parent.tree)
    for path, data in files.items():
        index.add(pygit2.IndexEntry(path, repo.create_blob(data), pygit2.GIT_FILEMODE_BLOB))
    sig = pygit2.Signature("bench", "bench@example.invalid", when, 0)
    oid = repo.create_commit(None, sig, sig, message, index.write_tree(repo), [parent.id])
    repo.references.create(f"refs/pull/{pr}/head", oid, force=True)
    return repo[oid]


def pins_at(pins_path: Path, commit_: pygit2.Commit, pr: int) -> Path:
    data = yaml.safe_load(pins_path.read_text())
    sha = str(commit_.id)
    data["components"]["vllm"]["commit"], data["components"]["vllm"]["pr"] = sha, pr
    out = pins_path.with_name(f"pins-{sha[:8]}.yaml")
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def install_time(log_path: Path) -> dict[str, Any]:
    """install.py's INSTALL-TIME line of the vllm step: pip's wall seconds and CPU seconds (pip + compilers)."""
    inside = False
    for line in log_path.read_text().splitlines():
        if line.startswith("Step "):
            inside = "install.py" in line and "/vllm.json" in line
        elif inside and line.startswith("INSTALL-TIME "):
            data: dict[str, Any] = json.loads(line[len("INSTALL-TIME "):])
            return data
    return {"wall_s": float("nan"), "cpu_s": float("nan")}


def run(pins_path: Path, settings: Settings) -> dict[str, Any]:
    pins = pins_mod.load(pins_path)
    rendered = render.render(pins, lock_record.of(pins), sources.resolve(pins, SETTINGS), SETTINGS)
    built = build.build(rendered, settings, echo=False)
    steps = json.loads(build.steps_file(built).read_text())
    step = next(s for s in steps if "install.py" in s["instruction"] and "/vllm.json" in s["instruction"])
    times = install_time(Path(built.log_path))
    counters = {}
    stats = Path(rendered.context_path).parent / "ccache.json"
    if stats.exists() and settings.compiler_cache:
        counters = json.loads(stats.read_text()).get("vllm", {})
        stats.unlink()
    engine.remove_image(engine.connect(SETTINGS), rendered.tag)
    return {"seconds": step["seconds"], "cached": step["cached"], "counters": counters, **times,
            "digest": built.manifest_digest, "base": pins.base.digest}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=8)
    parser.add_argument("--functions", type=int, default=160)
    args = parser.parse_args()
    off = dataclasses.replace(SETTINGS, compiler_cache=False)
    demo = prepare_demo(SETTINGS)
    with tempfile.TemporaryDirectory(prefix="bench-ccache-") as tmp:
        pins_path = variant_pins(Path(tmp), pins_path=demo)
        data = yaml.safe_load(pins_path.read_text())
        repo = pygit2.Repository(str(Path(tmp) / data["components"]["vllm"]["url"]))
        head = repo.get(data["components"]["vllm"]["commit"])
        sources_list = ", ".join(['"csrc/_C.c"'] + [f'"csrc/unit{k}.c"' for k in range(args.units)])
        files = {f"csrc/unit{k}.c": unit(k, args.functions) for k in range(args.units)}
        files["setup.py"] = ('from setuptools import Extension, setup\n\n'
                             f'setup(ext_modules=[Extension("tinyengine._C", [{sources_list}])])\n').encode()
        when = int(head.commit_time)
        grown = commit(repo, head, files, f"csrc: {args.units} more units", when + 3600, 901)
        c_source = (grown.tree / "csrc" / "_C.c").data
        touched = commit(repo, grown, {"csrc/_C.c": c_source + b"/* touched */\n"}, "touch _C.c", when + 7200, 902)
        edited = commit(repo, grown, {"csrc/unit0.c": unit(0, args.functions, salt=1)}, "edit unit0", when + 10800, 903)
        client = engine.connect(SETTINGS)
        store = ccache.store(SETTINGS, "vllm", data["base"]["image"].split("@")[1], ccache.machine_of(client))
        shutil.rmtree(store)  # the cold start
        rows = [("grow (cold cache)", run(pins_at(pins_path, grown, 901), SETTINGS))]
        for name, sha, pr in (("touch one file", touched, 902), ("edit one unit", edited, 903)):
            rows.append((f"{name}, no cache", run(pins_at(pins_path, sha, pr), off)))
            rows.append((f"{name}, cache", run(pins_at(pins_path, sha, pr), SETTINGS)))
    print(f"\ncompiler cache on tinyengine._C ({args.units + 1} translation units, {args.functions} functions per"
          f" generated unit; load {os.getloadavg()[0]:.1f}): the tinyengine install step (pip: compile, link, install)"
          " as wall seconds and as CPU seconds of pip and the compilers")
    print(f"{'build':<28} {'wall s':>7} {'CPU s':>7} {'ccache hits/calls':>18} {'hit rate':>9}  manifest digest")
    for name, row in rows:
        c = row["counters"]
        hits = f"{c.get('hits', 0)}/{c.get('calls', 0)}" if c else "-"
        rate = f"{100 * c['hits'] / c['calls']:.0f}%" if c.get("calls") else "-"
        print(f"{name:<28} {row['wall_s']:>7.2f} {row['cpu_s']:>7.2f} {hits:>18} {rate:>9}  {row['digest'][:19]}")
    same = all(rows[i][1]["digest"] == rows[i + 1][1]["digest"] for i in (1, 3))
    for i in (1, 3):
        off_, on_ = rows[i][1], rows[i + 1][1]
        print(f"{rows[i][0].split(',')[0]}: with the cache {off_['cpu_s'] / max(on_['cpu_s'], 1e-9):.1f}x less CPU,"
              f" {off_['wall_s'] / max(on_['wall_s'], 1e-9):.1f}x less wall time")
    print(f"same digest with and without the cache: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
