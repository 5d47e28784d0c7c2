"""A contract kit for ``aios check`` rules: subclass :class:`CheckRuleContract` in a test module
(or call :func:`prove`) to prove a rule class against its own examples.

    from aios.testing.check_rule_contract import CheckRuleContract

    class TestMyRule(CheckRuleContract):
        rule = MyRule

Each rule runs alone, as ``aios check`` runs it (the same walk, scopes and guards), over its
examples. Every wrong example gives a finding of the declared code at the declared line and
level, with the file and line it is in (``path:line:col`` when printed), a severity aios knows
(error, warning, note), a code among the rule's declared codes and a message naming the
example's replacement; an error or a warning names where it breaks (backends or strategies), a
note names none. Every right example gives no finding of the rule's codes. The class itself
declares codes, node types and at least one example of each kind.
"""

from __future__ import annotations

import ast
from typing import ClassVar

from aios.check import LEVELS, CheckRule, check_source

EXAMPLE_PATH = "example_{}.py"


def prove(rule: type[CheckRule]) -> None:
    """Raise AssertionError naming the first example of ``rule`` that does not behave as it
    declares (or the declaration that is missing)."""
    name = rule.__name__
    assert isinstance(rule, type) and issubclass(rule, CheckRule), f"{rule!r} is no CheckRule"
    assert rule.codes, f"{name} declares no codes"
    assert rule.nodes and all(issubclass(n, ast.AST) for n in rule.nodes), (
        f"{name} declares no AST node types to look at"
    )
    assert rule.wrong, f"{name} has no example of wrong code"
    assert rule.right, f"{name} has no example of right code"
    covered = {e.code for e in rule.wrong}
    assert covered <= set(rule.codes), f"{name}: examples of undeclared codes {covered}"
    for i, ex in enumerate(rule.wrong):
        path = EXAMPLE_PATH.format(i)
        found = check_source(ex.source, path, [rule])
        at = [f for f in found if f.line == ex.line and f.code == ex.code]
        assert at, f"{name} wrong example {i}: no {ex.code} at line {ex.line}; got " + (
            ", ".join(f"{f.line}:{f.code}" for f in found) or "nothing"
        )
        f = at[0]
        assert f.path == path and f.line >= 1 and f.col >= 1, f"{name}: {f} has no file:line"
        assert str(f).startswith(f"{path}:{ex.line}:"), f"{name}: printed as {f}"
        assert f.level in LEVELS and f.level == ex.level, (
            f"{name} wrong example {i}: level {f.level}, declared {ex.level}"
        )
        assert ex.replacement and ex.replacement in f.message, (
            f"{name} wrong example {i}: the message does not name {ex.replacement!r}: {f.message}"
        )
        if f.level == "note":
            assert f.backends == () and f.where() == "note", f"{name}: a note that breaks: {f}"
        else:
            assert f.backends or f.strategies, f"{name}: {f} names nowhere it breaks"
        for other in found:
            assert other.code in rule.codes, f"{name} reported undeclared {other.code}"
    for i, src in enumerate(rule.right):
        found = [f for f in check_source(src, EXAMPLE_PATH.format(i), [rule])]
        assert not found, f"{name} right example {i} gave " + "; ".join(str(f) for f in found)


class CheckRuleContract:
    """Subclass with ``rule = MyRule``; pytest collects the tests."""

    rule: ClassVar[type[CheckRule]]

    def test_declares_codes_nodes_and_examples(self) -> None:
        rule = self.rule
        assert rule.codes and rule.nodes and rule.wrong and rule.right, rule.__name__

    def test_examples_fire_and_stay_silent_as_declared(self) -> None:
        prove(self.rule)
