"""Hashing rate of checkpoint weight evidence (acceptance/weights.py) on a 1 GB checkpoint (prints figures).

usage: python benchmarks/bench_weights.py [--gb 1.0] [--shards 4] [--runs 3] [--dir DIR]

Writes the same random bf16/fp32 tensors once as safetensors shards (safetensors library) and once as
torch files (torch.save), then times `weights.snapshot()` of each in a fresh child process, so the
memory printed is the hashing's own (heap growth sampled from RssAnon; VmHWM, which counts the mapped
file pages of torch's mmap). The page cache is warm after the first run: the best of --runs is the
hashing rate, the first run includes reading from disk.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHILD = """
import json, sys, threading, time
sys.path.insert(0, {root!r})
from acceptance import weights

def status():
    return {{k: int(v.split()[0]) / 1024 for k, v in (l.split(":", 1) for l in open("/proc/self/status"))
            if k in ("VmHWM", "RssAnon")}}

peak, done = [0.0], threading.Event()
def watch():  # anonymous (heap) memory, sampled: file pages of an mmapped checkpoint are page cache
    while not done.wait(0.005):
        peak[0] = max(peak[0], status()["RssAnon"])
threading.Thread(target=watch, daemon=True).start()
base = status()["RssAnon"]
start = time.perf_counter()
snap = weights.snapshot({path!r})
seconds = time.perf_counter() - start
done.set()
print(json.dumps({{"seconds": seconds, "tensors": len(snap["tensors"]), "digest": snap["digest"],
                  "anon_mb": max(peak[0], status()["RssAnon"]) - base, "hwm_mb": status()["VmHWM"]}}))
"""


def write(directory: Path, gb: float, shards: int) -> int:
    """1 GB of tensors (4096-wide bf16 and fp32 matrices), split into shards; returns the bytes written."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    tensors, total, i = {}, 0, 0
    while total < gb * 2**30:
        dtype = torch.bfloat16 if i % 2 else torch.float32
        t = torch.randn(4096, 2048, generator=g).to(dtype)      # 16 MiB (bf16) or 32 MiB (fp32)
        tensors[f"model.layers.{i // 4}.mlp.w{i % 4}.weight"] = t
        total += t.numel() * t.element_size()
        i += 1
    names = sorted(tensors)
    for fmt in ("safetensors", "torch"):
        (directory / fmt).mkdir()
    for k in range(shards):
        part = {n: tensors[n] for n in names[k::shards]}
        save_file(part, str(directory / "safetensors" / f"model-{k + 1:05d}-of-{shards:05d}.safetensors"))
        torch.save(part, directory / "torch" / f"pytorch_model-{k + 1:05d}-of-{shards:05d}.bin")
    return total


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write the checkpoint (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-weights-") as tmp:
        total = write(Path(tmp), args.gb, args.shards)
        print(f"checkpoint: {total / 2**30:.2f} GiB of tensors in {args.shards} shards per format")
        digests = set()
        for fmt in ("safetensors", "torch"):
            runs = []
            for _ in range(args.runs):
                code = CHILD.format(root=str(ROOT), path=os.path.join(tmp, fmt))
                out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            best = min(r["seconds"] for r in runs)
            digests.add(runs[0]["digest"])
            print(f"{fmt:12s} first {runs[0]['seconds']:.2f} s, best {best:.2f} s = {total / 2**20 / best:.0f} MiB/s; "
                  f"{runs[0]['tensors']} tensors; heap growth {max(r['anon_mb'] for r in runs):.0f} MiB, "
                  f"peak RSS incl. mapped file pages {max(r['hwm_mb'] for r in runs):.0f} MiB")
        print("same digest from both formats:", len(digests) == 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
