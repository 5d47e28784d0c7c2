"""The shape of an ``aios check`` rule: a small class that looks at the node types it declares
and records findings through the file's :class:`~aios.check.callgraph.Context`, with its own
examples of wrong code (what it reports, at which line, naming which replacement) and right code
(where it stays silent). Plugins contribute rule classes through the ``aios_check_rules`` hook;
:mod:`aios.testing.check_rule_contract` proves a rule against its own examples."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import ClassVar

from aios.check.callgraph import Context


@dataclass(frozen=True)
class Example:
    """Wrong code a rule reports: ``code`` at ``line`` (1-based), at ``level``, its message
    naming ``replacement`` (the aios form, or what to do instead)."""

    source: str
    code: str
    line: int
    replacement: str
    level: str = "error"


class CheckRule:
    """One rule (or a family of closely related ones) of ``aios check``.

    ``codes``: the codes it reports (``AIOSnnn``; a plugin's own prefix is fine). ``nodes``: the
    AST node types :meth:`check` is called for, in the order the walker meets them (a call's
    qualified name is ``ctx.q``, its last name ``ctx.last``). ``wrong``/``right``: its examples.
    Rules hold no state of their own: what must last for a file lives on the context."""

    codes: ClassVar[tuple[str, ...]] = ()
    nodes: ClassVar[tuple[type[ast.AST], ...]] = ()
    wrong: ClassVar[tuple[Example, ...]] = ()
    right: ClassVar[tuple[str, ...]] = ()

    def check(self, ctx: Context, node: ast.AST) -> None:
        """Look at ``node`` (one of :attr:`nodes`); report with ``ctx.add(...)``."""

    def finish(self, ctx: Context) -> None:
        """After the whole file was walked (findings that need every call site)."""
