"""What `make demo` needs before building: engine + registry, the demo base image, the demo stack
repositories in pins/demo-stack/, and pins/demo.yaml pointing at the base image's digest."""
from __future__ import annotations

from pathlib import Path

from builder import log

PROJECT = Path(__file__).resolve().parent.parent
PINS = PROJECT / "pins" / "demo.yaml"
STACK = PROJECT / "pins" / "demo-stack"


def prepare_demo(pins_path: Path = PINS) -> Path:
    """Idempotent; fast when everything is already there. Returns the pins path."""
    from builder import baseimage, infra

    with log.step("demo: engine + registry"):
        infra.ensure_all()
    with log.step("demo: base image"):
        ref = baseimage.ensure_base_image()
    with log.step("demo: stack repositories"):
        make_stack(STACK)
    baseimage.write_demo_pins_digest(pins_path, ref)
    return Path(pins_path)


def make_stack(out_dir: Path) -> None:
    import sys

    if str(PROJECT) not in sys.path:  # demo/ is a directory at the repo root, not an installed package
        sys.path.insert(0, str(PROJECT))
    from demo.make_stack import make_stack as generate

    generate(out_dir)


def variant_pins(out_dir: Path, component: str | None = None, pr: int | None = None, edit=None,
                 pins_path: Path = PINS) -> Path:
    """A copy of the demo pins in out_dir (with its own copy of the stack and lock) where one
    component is pinned to the head of demo PR `pr`; `edit(data)` may change anything else.
    URLs stay relative, so the Dockerfile differs only where the change reaches."""
    import shutil

    import pygit2
    import yaml

    out_dir = Path(out_dir)
    pins_path = Path(pins_path)
    shutil.copytree(pins_path.parent / "demo-stack", out_dir / "demo-stack", dirs_exist_ok=True)
    shutil.copytree(pins_path.parent / "locks", out_dir / "locks", dirs_exist_ok=True)
    data = yaml.safe_load(pins_path.read_text())
    if component is not None:
        comp = data["components"][component]
        repo = pygit2.Repository(str(out_dir / comp["url"]))
        ref = repo.references.get(f"refs/pull/{pr}/head")
        if ref is None:
            raise ValueError(f"{comp['url']}: no refs/pull/{pr}/head")
        comp["commit"], comp["pr"] = str(ref.resolve().target), int(pr)
    if edit is not None:
        edit(data)
    out = out_dir / "pins.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def signing_key() -> Path:
    """$BUILDER_SIGNING_KEY, else the demo key pair in the cache (made once, private key mode 0600)."""
    from builder import dsse, options
    from builder.paths import cache_dir

    configured = options.signing_key()
    if configured is not None:
        return configured
    private = cache_dir("keys") / "demo-signing.pem"
    if not private.exists():
        kid = dsse.keygen(private, private.with_name("demo-signing.pem.pub"))
        log.info(f"demo: new signing key {kid[:16]}; public key {private}.pub")
    return private


def add_pr_commit(repo_path: Path, pr: int, path: str, content: str, message: str) -> str:
    """Push a new commit onto refs/pull/<pr>/head of a demo repository (as a PR author would): `path`
    gets `content` on top of the current head.  Returns the new commit's SHA."""
    import pygit2

    repo = pygit2.Repository(str(repo_path))
    ref = repo.references[f"refs/pull/{pr}/head"]
    head = repo[ref.resolve().target]
    index = pygit2.Index()
    index.read_tree(head.tree)
    index.add(pygit2.IndexEntry(path, repo.create_blob(content.encode()), pygit2.enums.FileMode.BLOB))
    tree = index.write_tree(repo)
    sig = pygit2.Signature("Demo Author", "author@example.invalid", int(head.committer.time) + 3600, 0)
    oid = repo.create_commit(None, sig, sig, message, tree, [head.id])
    ref.set_target(oid)
    return str(oid)
