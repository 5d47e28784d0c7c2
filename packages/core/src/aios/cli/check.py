"""``aios check SCRIPT... [--backend NAME] [--json] [--fix]``: what ties training scripts to one
accelerator (static; imports no torch). Each script is read with the modules of its own project it
imports and the configs it loads; a finding in a shared helper is printed once. Rules come from
every plugin's ``aios_check_rules`` hook (core's own among them). Exit 1 when something breaks
somewhere (an error: it raises, or silently changes what the script trains), 0 when clean or only
warnings and notes remain, 2 on bad input."""

from __future__ import annotations

import difflib
import json
import os
import sys
import tempfile

import click

from aios.errors import AiosError
from aios.plugins.registry import get_registry


def _write_atomically(path: str, text: str) -> None:
    """Temp file in the same directory, then rename: the script is never half-written."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".aios-check-", suffix=".py", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.chmod(tmp, os.stat(path).st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@click.command(name="check")
@click.argument("scripts", nargs=-1, required=True, metavar="SCRIPT...")
@click.option(
    "--backend",
    default=None,
    help="Only what breaks (or silently differs) on this backend: cpu, cuda, xla, tpu, neuron. "
    "Notes are left out.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable findings.")
@click.option(
    "--fix", is_flag=True, help="Apply the safe rewrites (shown as a diff); the rest stay findings."
)
def check(scripts: tuple[str, ...], backend: str | None, as_json: bool, fix: bool) -> None:
    """Find what ties training scripts to one accelerator, with the aios replacement.

    One line per finding: PATH:LINE:COL CODE message (where it breaks, or "note"). Directories are
    searched for *.py files. Exit status: 1 when something breaks (an error), 0 when clean or
    only warnings and notes remain, 2 on bad input.
    """
    # deferred: the checker loads when a script is checked, not for `aios check --help`
    from aios.check import (
        BACKENDS,
        CheckError,
        check_project,
        expand,
        fix_source,
        for_backend,
        read_source,
        rules_from,
    )

    if backend is not None and backend not in BACKENDS:
        raise AiosError(
            f"aios check knows no backend '{backend}'",
            "use one of " + ", ".join(BACKENDS) + " (or leave --backend out for all)",
        )
    rules = rules_from(get_registry())
    files = expand(scripts)
    if not files:
        raise AiosError(
            "no Python files under " + ", ".join(scripts),
            "name a script or a folder holding *.py files",
        )
    findings = []
    seen: set[tuple[str, int, str]] = set()  # a helper two scripts import: its findings once
    diffs: list[dict[str, str]] = []
    try:
        for path in files:
            source = read_source(path)
            found = for_backend(check_project(path, rules), backend)
            own = [f for f in found if f.path == path]
            if fix and any(f.fix for f in own):
                try:
                    fixed = fix_source(source, own)
                except CheckError as exc:  # the findings stand; nothing is written
                    click.echo(f"aios check: not rewriting {path}: {exc}", err=True)
                    fixed = source
                if fixed != source:
                    diff = "".join(
                        difflib.unified_diff(
                            source.splitlines(keepends=True),
                            fixed.splitlines(keepends=True),
                            path,
                            path,
                        )
                    )
                    _write_atomically(path, fixed)
                    diffs.append({"path": path, "diff": diff})
                    found = for_backend(check_project(path, rules), backend)
            for f in found:
                key = (os.path.abspath(f.path), f.line, f.code)
                if key not in seen:
                    seen.add(key)
                    findings.append(f)
    except CheckError as exc:
        raise AiosError(str(exc), "fix the file or leave it out") from None
    if as_json:
        out: dict[str, object] = {"findings": [f.to_json() for f in findings], "files": len(files)}
        if fix:
            out["fixed"] = diffs
        click.echo(json.dumps(out, indent=2))
    else:
        for d in diffs:
            click.echo(d["diff"], nl=not d["diff"].endswith("\n"))
        for f in findings:
            click.echo(str(f))
        named = {os.path.abspath(p) for p in files}
        # --fix rewrites the files named; a helper's rewrite needs the helper named
        fixable = sum(1 for f in findings if f.fix and os.path.abspath(f.path) in named)
        notes = sum(1 for f in findings if f.level == "note")
        summary = f"aios check: {len(findings)} finding(s)"
        if notes:
            summary += f" ({notes} note(s))"
        summary += f" in {len(files)} file(s)"
        more = {os.path.abspath(f.path) for f in findings} - named
        if more:
            summary += f" and {len(more)} file(s) they import or load"
        if diffs:
            summary += f"; fixed {len(diffs)} file(s)"
        if fixable:
            summary += f"; {fixable} fixable with --fix"
        click.echo(summary, err=True)
    sys.exit(1 if any(f.level == "error" for f in findings) else 0)
