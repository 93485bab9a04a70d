"""tests/budget.py's rule that a test over 60 s says why in its docstring (or its module's)."""
import types
from typing import Any

from tests import budget


def item(doc: str | None, module_doc: str | None = None) -> Any:
    def function() -> None:
        pass

    function.__doc__ = doc
    return types.SimpleNamespace(function=function, module=types.SimpleNamespace(__doc__=module_doc))


def test_a_docstring_that_says_over_60_s_is_a_reason_wherever_it_wraps() -> None:
    assert budget.says_why(item("Over 60 s (84 s measured): four Slurm gate steps."))
    assert budget.says_why(item("Builds twice.\n    Over\n    60 s: each build compiles."))
    assert budget.says_why(item(None, module_doc="The bisect test. Over 60 s: seven builds."))
    assert not budget.says_why(item("Builds twice."))
    assert not budget.says_why(item(None))


def test_only_a_long_call_without_a_reason_is_listed(monkeypatch: Any) -> None:
    monkeypatch.setattr(budget, "_spent", {"a": {"setup": 300.0, "call": 1.0}, "b": {"call": 61.0},
                                           "c": {"call": 90.0}, "d": {"call": 59.0}})
    monkeypatch.setattr(budget, "_said_why", {"a": False, "b": False, "c": True, "d": False})
    assert budget.long_without_reason() == [("b", 61.0)]
