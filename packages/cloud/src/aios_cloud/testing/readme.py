"""The commands a README prints, for tests that run them as printed."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

SHELL = ("", "bash", "sh", "shell", "console")


def _blocks(readme: Path) -> list[str]:
    """The shell code blocks (fenced, with no language or a shell's)."""
    blocks: list[str] = []
    lang: str | None = None
    body: list[str] = []
    for line in readme.read_text().splitlines():
        if line.startswith("```"):
            if lang is None:
                lang, body = line[3:].strip(), []
            else:
                if lang in SHELL:
                    blocks.append("\n".join(body) + "\n")
                lang = None
        elif lang is not None:
            body.append(line)
    return blocks


def readme_commands(readme: Path, prefix: str = "aios launch") -> list[list[str]]:
    """Every command starting with ``prefix`` in the README's code blocks, as argv: lines joined
    at a trailing backslash, split at ``;``, comments dropped."""
    out: list[list[str]] = []
    for block in _blocks(readme):
        text = re.sub(r"\\\n\s*", " ", block)
        for line in text.splitlines():
            for part in line.split(";"):
                if not part.strip().startswith(prefix):
                    continue
                argv = shlex.split(part, comments=True)
                if argv[: len(prefix.split())] == prefix.split():
                    out.append(argv)
    return out


def readme_exports(readme: Path) -> dict[str, str]:
    """``export NAME=VALUE`` lines of the README's code blocks (what it tells users to set)."""
    env: dict[str, str] = {}
    for block in _blocks(readme):
        for line in block.splitlines():
            if not line.startswith("export "):
                continue
            argv = shlex.split(line, comments=True)
            if len(argv) == 2 and argv[0] == "export" and "=" in argv[1]:
                k, _, v = argv[1].partition("=")
                env[k] = v
    return env


def as_dry_run(argv: list[str]) -> list[str]:
    """``aios launch ... SCRIPT`` with ``--dry-run`` (where a real cloud is needed): the flag goes
    before SCRIPT (options after it are the script's own)."""
    if "--dry-run" in argv:
        return list(argv)
    return [*argv[:2], "--dry-run", *argv[2:]]


__all__ = ["as_dry_run", "readme_commands", "readme_exports"]
