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


def test_lines_after_a_rank_exit_run_on_rank_0_only():
    """icefall's habit: ``if rank != 0: return`` opens the checkpoint helper; the state dict
    taken after it is a one-rank save, like one under ``if rank == 0:``."""
    src = """import torch
def save_checkpoint(path, model, rank=0):
    if rank != 0:
        return
    torch.save({"model": model.state_dict()}, path)
save_checkpoint("x.pt", model, rank=rank)
"""
    assert [(f.line, f.code) for f in check_source(src)] == [(5, "AIOS603")]


def test_a_cuda_function_named_for_a_later_call_is_judged_as_that_call():
    """nanochat's ``synchronize = torch.cuda.synchronize if device_type == "cuda" else ...``
    (a note: only with CUDA) and llama-cookbook's ``autocast = torch.cuda.amp.autocast if
    use_fp16 else nullcontext`` (CUDA autocast); a test named without a call is no finding."""
    src = """import torch
from contextlib import nullcontext
sync = torch.cuda.synchronize if device_type == "cuda" else (lambda: None)
autocast = torch.cuda.amp.autocast if cfg.use_fp16 else nullcontext
probe = torch.cuda.is_available
"""
    assert [(f.line, f.code, f.level) for f in check_source(src)] == [
        (3, "AIOS104", "note"),
        (4, "AIOS301", "error"),
    ]


def test_a_device_type_helper_and_a_model_moved_only_with_cuda_are_device_choices():
    """A helper returning "cuda", else "mps", else "cpu" (nanochat), and ``if
    torch.cuda.is_available(): model.to("cuda")`` with no else (llama-cookbook): on a TPU the
    model trains on the host CPU. With an else that places it, the test guards a note only."""
    src = """import torch
def device_type():
    if torch.cuda.is_available():
        return "cuda"
    if torch.backends.mps.is_available():
        return "mps"
    return "cpu"
if torch.cuda.is_available():
    model.to("cuda")
"""
    assert [(f.line, f.code, f.level) for f in check_source(src)] == [
        (3, "AIOS106", "error"),
        (8, "AIOS106", "error"),
        (9, "AIOS101", "note"),
    ]
    other = "import torch\nif torch.cuda.is_available():\n    model.cuda()\nelse:\n    model.to(rt.device)\n"
    assert [f.code for f in check_source(other)] == ["AIOS102"]
