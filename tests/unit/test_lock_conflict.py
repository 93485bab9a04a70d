"""A lock whose components conflict names the two components and what each wants (builder/lock/lockfile.py)."""
import pytest

from builder.core.errors import BadInput
from builder.core.options import Settings
from builder.lock import lockfile as lock
from builder.lock import resolver
from builder.lock.resolver import Target

# uv 0.13.9's text for two requirements on one distribution that no version satisfies (captured)
UV_NO_SOLUTION = """error: No solution found when resolving dependencies
  cause: Because you require one of:
             transformers>=5.5.3,<5.6.0
             transformers>5.6.0,<5.11
         and transformers>=5.16.1,<5.21.0, we can conclude that your requirements are unsatisfiable."""
REQS = {"vllm": ["transformers>=5.16.1,<5.21.0", "numpy"], "megatron": ["numpy", "packaging"],
        "verl": ["transformers>=5.5.3,!=5.6.0,<5.11", "hydra-core"]}


def test_the_explanation_keeps_the_resolvers_lists() -> None:
    text = resolver._explain(UV_NO_SOLUTION)
    assert "\n" not in text and "transformers>=5.5.3,<5.6.0 transformers>5.6.0,<5.11 and transformers>=5.16.1" in text


def test_components_that_conflict_only_together_are_named_with_what_each_wants(monkeypatch: pytest.MonkeyPatch,
                                                                                settings: Settings) -> None:
    calls: list[str] = []
    target = Target(python="3.11", abi="cp311", machine="x86_64", glibc=(2, 36))  # unused by the fake

    def fake_resolve(settings: Settings, reqs: list[str], provided: dict[str, str], target: Target, resolver_name: str,
                     log_name: str = "") -> dict[str, str]:
        calls.append(log_name)
        wanted = {r for r in reqs if r.startswith("transformers")}
        if len(wanted) > 1:
            raise BadInput(resolver._explain(UV_NO_SOLUTION))
        return {}

    monkeypatch.setattr(resolver, "resolve", fake_resolve)
    with pytest.raises(BadInput) as err:
        lock._resolve_all(settings, REQS, {}, target, "uv", "runtime")
    message = str(err.value)
    assert message.startswith("components.vllm and components.verl: runtime requirements conflict: vllm wants"
                              " transformers>=5.16.1,<5.21.0; verl wants transformers>=5.5.3,!=5.6.0,<5.11 (")
    assert "\n" not in message and len(message) <= 300  # the error line budget (the rest is in the log)
    assert calls[-1] == "lock-resolve-runtime-vllm-verl"  # the union, each alone, then pairs until one fails
