"""Running ``aios check``: a file or a whole project through the rules, and the findings
narrowed to a backend. The rules are handed in (the command collects them from every plugin's
``aios_check_rules`` hook); without them, core's own (:data:`aios.check.rules.CORE_RULES`)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from aios.check.findings import Finding
from aios.check.project import (
    _config_files,
    _project_modules,
    _python_configs,
    check_config,
    parse,
    project_facts,
    read_source,
)
from aios.check.rules import CORE_RULES
from aios.check.rules.base import CheckRule
from aios.check.walker import Checker
from aios.errors import AiosError

Rules = Sequence[type[CheckRule]]


class RuleSource(Protocol):
    """What :func:`rules_from` needs of the plugin registry."""

    def call_all(
        self, hook_name: str, **kwargs: Any
    ) -> list[tuple[str, Any, BaseException | None]]: ...


def rules_from(registry: RuleSource) -> list[type[CheckRule]]:
    """Every plugin's rule classes (``aios_check_rules``), core's first. A plugin that fails or
    hands over something that is no rule class is named in one line (exit 2)."""
    found: list[tuple[str, type[CheckRule]]] = []
    for plugin, result, exc in registry.call_all("aios_check_rules"):
        if exc is not None:
            raise AiosError(
                f'plugin "{plugin}" failed in aios_check_rules: {type(exc).__name__}: {exc}',
                f"fix or disable the plugin (AIOS_DISABLE_PLUGINS={plugin})",
            )
        for rule in result or ():
            if not (isinstance(rule, type) and issubclass(rule, CheckRule) and rule.codes):
                raise AiosError(
                    f'plugin "{plugin}" gave aios check {rule!r}, which is no rule class '
                    "(a subclass of aios.check.CheckRule with its codes)",
                    f"fix or disable the plugin (AIOS_DISABLE_PLUGINS={plugin})",
                )
            found.append((plugin, rule))
    found.sort(key=lambda pr: pr[0] != "aios-core")  # core's first, the rest as registered
    return [rule for _, rule in found]


def check_source(source: str, path: str = "<string>", rules: Rules | None = None) -> list[Finding]:
    """Findings for ``source``; raises :class:`CheckError` when it is not Python."""
    tree = parse(source, path)
    return Checker(path, source, tree, [r() for r in rules or CORE_RULES]).run()


def check_file(path: str, rules: Rules | None = None) -> list[Finding]:
    return check_source(read_source(path), path, rules)


def check_project(path: str, rules: Rules | None = None) -> list[Finding]:
    """Findings for the script at ``path`` and for what it brings in of its own project: the
    modules it imports from its folder (followed with what they define: a rank-0 save wrapper, a
    device helper, DDP inside a helper, rank tests), and the configs it loads that name a device.
    Each finding carries the path of the file it is in."""
    source = read_source(path)
    tree = parse(source, path)
    modules = _project_modules(path, source, tree)
    root = os.path.dirname(path) or "."
    configs = _config_files(root, modules) + _python_configs(root, modules)
    config_found = [f for c in configs for f in check_config(c)]
    project = project_facts(modules, configs)
    made = [r() for r in rules or CORE_RULES]
    found: list[Finding] = []
    for mod in reversed(modules):  # helpers first: their functions are known to the callers
        checker = Checker(mod.path, mod.source, mod.tree, made, project, mod.name, mod.package)
        found.extend(checker.run())
    return found + config_found


def expand(paths: Iterable[str]) -> list[str]:
    """Files to check: each file given, and the ``*.py`` files under each directory given."""
    out: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
                out.extend(os.path.join(root, f) for f in sorted(files) if f.endswith(".py"))
        else:
            out.append(p)
    return out


def for_backend(findings: Iterable[Finding], backend: str | None) -> list[Finding]:
    if backend is None:
        return list(findings)
    # what breaks (or silently differs) there; notes break nothing anywhere
    return [f for f in findings if backend in f.backends and f.level != "note"]
