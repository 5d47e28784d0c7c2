"""``aios check``'s rules as registered classes: every rule core contributes through the
``aios_check_rules`` hook passes the rule contract kit on its own examples; the kit catches a rule
that does not do what its examples say; plugins' rules reach the command."""

from __future__ import annotations

import ast
from typing import ClassVar

import pytest
from aios.check import CORE_RULES, CheckRule, Example, check_source, rules_from
from aios.cli.main import cli
from aios.errors import AiosError
from aios.plugins.registry import get_registry
from aios.testing.check_rule_contract import prove
from click.testing import CliRunner


@pytest.mark.parametrize("rule", CORE_RULES, ids=lambda r: r.__name__)
def test_every_core_rule_passes_the_contract_on_its_own_examples(rule):
    prove(rule)


def test_hook_aios_check_rules():
    """Core's rules come through the hook, first."""
    rules = rules_from(get_registry())
    assert rules[: len(CORE_RULES)] == list(CORE_RULES)
    assert all(issubclass(r, CheckRule) for r in rules)


class _Silent(CheckRule):
    """Declares a finding it never gives."""

    codes = ("XTST001",)
    nodes = (ast.Call,)
    wrong = (Example("f()\n", "XTST001", 1, "g()"),)
    right = ("g()\n",)


class _Loud(CheckRule):
    """Gives a finding in its right example."""

    codes = ("XTST002",)
    nodes = (ast.Call,)
    wrong = (Example("f()\n", "XTST002", 1, "g()"),)
    right = ("h()\n",)

    def check(self, ctx, node):
        ctx.add(node, "XTST002", "calls something: use g()")


class _NoReplacement(_Loud):
    right = ("x = 1\n",)
    wrong = (Example("f()\n", "XTST002", 1, "rt.device"),)


class _WrongLevel(_Loud):
    right = ("x = 1\n",)
    wrong = (Example("f()\n", "XTST002", 1, "g()", "note"),)


@pytest.mark.parametrize(
    "rule,says",
    [
        (_Silent, "no XTST001 at line 1"),
        (_Loud, "right example 0 gave"),
        (_NoReplacement, "does not name 'rt.device'"),
        (_WrongLevel, "level error, declared note"),
    ],
)
def test_the_kit_names_a_rule_that_breaks_its_examples(rule, says):
    with pytest.raises(AssertionError, match=says):
        prove(rule)


def test_a_rule_handed_in_is_run_with_the_walk_and_guards():
    class NoPrint(CheckRule):
        codes = ("XTST003",)
        nodes: ClassVar = (ast.Call,)

        def check(self, ctx, node):
            if ctx.q == "" and ctx.last == "print" and not ctx.cuda_guard:
                ctx.add(node, "XTST003", "print on every rank: use rt.print()", ("cpu",))

    src = "import torch\nprint(1)\nif torch.cuda.is_available():\n    print(2)\n"
    found = check_source(src, "t.py", [NoPrint])
    assert [(f.line, f.code) for f in found] == [(2, "XTST003")]
    assert str(found[0]).startswith("t.py:2:1 XTST003 print on every rank")


def test_a_plugin_giving_no_rule_class_is_one_line():
    class Reg:
        def call_all(self, hook_name, **kwargs):
            assert hook_name == "aios_check_rules"
            return [("aios-core", list(CORE_RULES), None), ("bad-plugin", [object], None)]

    with pytest.raises(AiosError, match='plugin "bad-plugin" gave aios check'):
        rules_from(Reg())


def test_exit_status_is_1_only_for_errors(tmp_path):
    """Warnings (a statistic that reads 0 elsewhere) and notes (a GradScaler, pin_memory) print
    but leave exit status 0; an error sets 1."""
    script = tmp_path / "t.py"
    script.write_text(
        "import torch\n"
        "scaler = torch.cuda.amp.GradScaler()\n"
        "dl = torch.utils.data.DataLoader([], pin_memory=True)\n"
        "print(torch.cuda.max_memory_allocated())\n"
    )
    r = CliRunner().invoke(cli, ["check", str(script)])
    levels = [f.level for f in check_source(script.read_text())]
    assert sorted(levels) == ["note", "note", "warning"], levels
    assert r.exit_code == 0 and len(r.stdout.splitlines()) == 3, r.output
    script.write_text("import torch\ntorch.cuda.set_device(0)\n")
    assert CliRunner().invoke(cli, ["check", str(script)]).exit_code == 1


def test_a_method_of_a_local_class_is_followed_to_its_save():
    """``model.save_networks(epoch)`` with ``model = Pix2Pix(opt)``: the torch.save inside is
    reached on every rank (CycleGAN's habit); under a rank test it is not."""
    src = """import torch
class Pix2Pix:
    def save_networks(self, epoch):
        torch.save(self.net.state_dict(), f"{epoch}.pth")
model = Pix2Pix()
for epoch in range(3):
    model.save_networks(epoch)
"""
    assert [(f.line, f.code) for f in check_source(src)] == [(4, "AIOS605")]
    guarded = src.replace(
        "    model.save_networks(epoch)", "    if rank == 0:\n        model.save_networks(epoch)"
    )
    # on one rank: no longer every rank's write, but the state dict there hangs a sharded run
    assert [f.code for f in check_source(guarded)] == ["AIOS603"]
