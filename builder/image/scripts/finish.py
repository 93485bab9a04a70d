"""The runtime stage's last step: smoke.py, then write_manifest.py, in one layer.

usage: finish.py  (paths are fixed under /opt/delivery)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import smoke  # noqa: E402
import write_manifest  # noqa: E402

D = "/opt/delivery"

if __name__ == "__main__":
    smoke.main(f"{D}/components.json")
    write_manifest.main(f"{D}/components.json", f"{D}/pins.json", f"{D}/dockerfile.sha256", f"{D}/manifest.json")
