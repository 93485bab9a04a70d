"""Write pip constraints pinning the base image's installed versions of the named distributions.

usage: constraints.py NAMES_FILE OUT   (NAMES_FILE: one distribution per line)
"""
import sys
from importlib import metadata


def main(names_file, out):
    names = [n.strip() for n in open(names_file).read().splitlines() if n.strip()]
    lines = []
    for name in names:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"build.constraints: {name} is not installed in the base image")
        lines.append(f"{name}=={version}\n")
    with open(out, "w") as fh:
        fh.writelines(lines)
    print("constraints:", " ".join(l.strip() for l in lines) or "(none)")


if __name__ == "__main__":
    main(*sys.argv[1:])
