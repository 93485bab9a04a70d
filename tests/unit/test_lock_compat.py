"""The pins' compat entries reach the lock: pinned there, checked against the base, part of --check's inputs."""
from types import SimpleNamespace

import pytest

from builder.core.errors import BadInput
from builder.engine.basecontainer import BaseInfo
from builder.lock import lockfile as lock
from builder.lock.resolver import Target

BASE = BaseInfo(image="b", python="3.11", abi="cp311", machine="x86_64", glibc=(2, 36),
                dists={"torch": "2.13.0+cpu", "numpy": "2.1.0"})


def pins_with(*compat: tuple[str, str]) -> SimpleNamespace:
    comps = {n: SimpleNamespace(distribution=d) for n, d in
             (("vllm", "tinyengine"), ("megatron", "megatron-core"), ("verl", "verl"))}
    return SimpleNamespace(components=comps, base=SimpleNamespace(image="b@sha256:x"),
                           compat=[SimpleNamespace(package=p, version=v, reason="r") for p, v in compat])


def test_compat_pins_are_locked_except_components_and_the_base() -> None:
    pins = pins_with(("triton", "3.9.0"), ("tinyengine", "0.2.0"), ("torch", "2.13.0+cpu"), ("Omegaconf", "2.3.0"))
    wanted = ["Omegaconf==2.3.0", "triton==3.9.0"]
    assert lock.compat_requirements(pins, BASE) == wanted  # type: ignore[arg-type]


def test_compat_pin_the_base_contradicts_is_an_error() -> None:
    with pytest.raises(BadInput, match=r"compat: requires 'numpy==1.26.4' but the base b@sha256:x provides numpy 2.1.0"):
        lock.compat_requirements(pins_with(("numpy", "1.26.4")), BASE)  # type: ignore[arg-type]


def test_compat_pins_change_the_inputs_sha256_only_when_present() -> None:
    target = Target.of(BASE)
    plain = lock.inputs_sha256(BASE, target, [])
    assert lock.inputs_sha256(BASE, target, [], []) == plain  # locks without compat keep their hash
    assert lock.inputs_sha256(BASE, target, [], ["triton==3.9.0"]) != plain
    assert lock.inputs_sha256(BASE, target, [], ["triton==3.8.0"]) != lock.inputs_sha256(BASE, target, [], ["triton==3.9.0"])
