"""mksquashfs of an image's root filesystem: seconds, size and sha256 per compression setting, and
whether the result depends on the number of processors.

    python benchmarks/bench_sqsh.py IMAGE_ID [--options '-comp lzo -noD' ...]
"""
import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from builder.core import files as fs
from builder.core.options import Settings  # noqa: E402
from builder.engine import client as engine
from builder.release import sqsh  # noqa: E402
from builder.release import sqsh_rootfs as layers

DEFAULT = ["-comp lzo -noD", "-comp lzo -Xalgorithm lzo1x_1 -noD", "-comp zstd -Xcompression-level 1"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("image")
    ap.add_argument("--options", action="append", help="mksquashfs options (repeatable)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-sqsh-"))
    try:
        start = time.monotonic()
        saved = layers.save(engine.connect(Settings.from_env()), args.image, work / "image.tar")
        rootfs = work / "rootfs"
        rootfs.mkdir()
        layers.apply_layers(saved, rootfs)
        size = sum(st.st_size for _, st in layers.walk(rootfs))
        print(f"rootfs {size / 1e9:.2f} GB from {len(saved.layers)} layers in {time.monotonic() - start:.1f} s; "
              f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
        for opts in args.options or DEFAULT:
            for procs in ("2", "1"):
                out = work / "out.sqsh"
                out.unlink(missing_ok=True)
                start = time.monotonic()
                sqsh.mksquashfs(rootfs, out, f"{opts} -processors {procs}", xattrs=False)
                took = time.monotonic() - start
                print(f"{opts:<40} -processors {procs}: {took:6.1f} s  {out.stat().st_size / 1e6:7.1f} MB  "
                      f"sha256 {fs.sha256_file(out)[:16]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
