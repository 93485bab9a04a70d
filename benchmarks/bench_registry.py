"""The registry door's costs against real docker-registry processes (the tests' three: TLS + htpasswd, TLS + token
auth, plain), reached as registry.test through an /etc/hosts line added and removed here (run as root):

- the token flow's overhead per publish against Basic (seconds, token requests per publish);
- the cross-registry base copy of a synthetic base (--mb, default 256; 2048 for the 2 GB goal) from the token
  registry to the htpasswd one, against `skopeo copy` of the same image between the same two registries when
  skopeo is installed (process start-up included), and the bytes a second copy moves (goal: 0).

- with --demo-base REF (the demo's base, e.g. 127.0.0.1:5000/demo/base@sha256:...): the same copy of that base from
  its plain loopback registry to the htpasswd one, against `skopeo copy` of it.

The tool's copy is timed in-process (inside `builder run` it is one step of the staging push); skopeo's time
includes its process start-up.

usage: python benchmarks/bench_registry.py [--mb 256] [--publishes 5] [--demo-base REF]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from builder.engine.registry import Registry, copy_blobs, push_blob, put_manifest  # noqa: E402
from tests.integration.test_registries import (  # noqa: E402
    MANIFEST,
    NAME,
    PASSWORD,
    USER,
    Tokens,
    publish,
    settings,
    start,
)


def base_image(reg: Registry, mb: int) -> tuple[str, list[dict[str, object]]]:
    """A synthetic base of `mb` MB in 64 MB layers on `reg` as demo/base:bench; its digest and blobs."""
    layers = []
    for left in range(mb, 0, -64):
        data = os.urandom(min(left, 64) << 20)
        layers.append({"mediaType": "application/vnd.oci.image.layer.v1.tar", "size": len(data),
                       "digest": push_blob(reg, "demo/base", data)})
    config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    conf = {"mediaType": "application/vnd.oci.image.config.v1+json", "size": len(config),
            "digest": push_blob(reg, "demo/base", config)}
    body = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST, "config": conf, "layers": layers}).encode()
    put_manifest(reg, "demo/base", "bench", body, MANIFEST)
    return "bench", [*layers, conf]


def demo_base(ref: str, target: Registry, cert_dir: str, skopeo: str | None) -> dict[str, object]:
    """The demo base (`host/name@digest` on a plain loopback registry) copied to `target` by the tool, then by
    skopeo into another repository there; seconds and MB each."""
    repository, digest = ref.split("@")
    host, name = repository.split("/", 1)
    source = Registry(host)
    manifest = json.loads(source.manifest_by_digest(name, digest))
    blobs = [*manifest["layers"], manifest["config"]]
    began = time.monotonic()
    moved = copy_blobs(source, name, target, "demo/rel-base", blobs)
    out: dict[str, object] = {"demo_base_copy_s": round(time.monotonic() - began, 2),
                              "demo_base_mb": moved["bytes"] >> 20}
    if skopeo:
        began = time.monotonic()
        subprocess.run([skopeo, "copy", "--src-tls-verify=false", f"--dest-cert-dir={cert_dir}",
                        f"--dest-creds={USER}:{PASSWORD}", f"docker://{ref}", f"docker://{target.host}/demo/skopeo-base:b"],
                       check=True, capture_output=True)
        out["demo_base_skopeo_copy_s"] = round(time.monotonic() - began, 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--publishes", type=int, default=5)
    parser.add_argument("--demo-base", default="", help="the demo base by digest, on a plain loopback registry")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-registry-"))
    hosts, line = Path("/etc/hosts"), f"127.0.0.1 {NAME}  # builder bench {os.getpid()}\n"
    tokens, procs = Tokens(folder), []  # type: Tokens, list[subprocess.Popen[bytes]]
    hosts.write_text(hosts.read_text() + line)
    try:
        world = start(folder, tokens, procs)
        basic, token = (f"{NAME}:{world['ports'][k]}" for k in "ab")
        out: dict[str, object] = {}
        for label, host in (("basic", basic), ("token", token)):
            calls, began = tokens.calls, time.monotonic()
            for n in range(args.publishes):
                publish(Registry.from_settings(host, settings(world, host)), f"bench/{label}{n}", "t")
            out[f"publish_s_{label}"] = round((time.monotonic() - began) / args.publishes, 3)
            out[f"token_requests_per_publish_{label}"] = (tokens.calls - calls) / args.publishes
        source = Registry.from_settings(token, settings(world, token))
        tag, blobs = base_image(source, args.mb)
        target = Registry.from_settings(basic, settings(world, basic))
        began = time.monotonic()
        first = copy_blobs(source, "demo/base", target, "demo/rel", blobs)
        out["copy_s"] = round(time.monotonic() - began, 2)
        out["copy_mb"] = first["bytes"] >> 20
        out["second_copy_bytes"] = copy_blobs(source, "demo/base", target, "demo/rel", blobs)["bytes"]
        skopeo = shutil.which("skopeo")
        if skopeo:
            ca = f"--src-cert-dir={world['certs_d']}/{token} --dest-cert-dir={world['certs_d']}/{basic}".split()
            began = time.monotonic()
            subprocess.run([skopeo, "copy", *ca, f"--src-creds={USER}:{PASSWORD}", f"--dest-creds={USER}:{PASSWORD}",
                            f"docker://{token}/demo/base:{tag}", f"docker://{basic}/demo/skopeo:{tag}"], check=True,
                           capture_output=True)
            out["skopeo_copy_s"] = round(time.monotonic() - began, 2)
        else:
            out["skopeo_copy_s"] = "skopeo not installed"
        if args.demo_base:
            out.update(demo_base(args.demo_base, Registry.from_settings(basic, settings(world, basic)),
                                 f"{world['certs_d']}/{basic}", skopeo))
        print(json.dumps({"mb": args.mb, **out}, indent=1))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)
        tokens.server.shutdown()
        hosts.write_text(hosts.read_text().replace(line, ""))
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
