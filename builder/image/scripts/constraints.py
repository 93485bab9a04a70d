"""Write pip constraints pinning the base image's installed versions of the named distributions.
A name the base does not have is left to install.py, which pins it once an earlier component
installed it (e.g. vllm before verl).

usage: constraints.py NAMES_FILE OUT   (NAMES_FILE: one distribution per line)
"""
from __future__ import annotations

import sys
from importlib import metadata


def main(names_file: str, out: str) -> None:
    names = [n.strip() for n in open(names_file).read().splitlines() if n.strip()]
    lines = []
    for name in names:
        try:
            lines.append(f"{name}=={metadata.version(name)}\n")
        except metadata.PackageNotFoundError:
            print(f"constraints: {name} not in the base; pinned once a component installs it")
    with open(out, "w") as fh:
        fh.writelines(lines)
    print("constraints:", " ".join(line.strip() for line in lines) or "(none)")


if __name__ == "__main__":
    main(*sys.argv[1:])
