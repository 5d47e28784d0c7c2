"""Errors that end a command with one line and exit status 2 (``--debug`` shows the traceback)."""

from __future__ import annotations

import errno
import os
import re
from typing import Any

from aios.config.redact import redact_url


class AiosError(Exception):
    """A user-facing error: ``message`` names the problem, ``fix`` what to do about it."""

    exit_code = 2

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def one_line(self) -> str:
        """``message; fix``, with the secrets of any URL in it redacted."""
        return redact_url(f"{self.message}; {self.fix}" if self.fix else self.message)

    def __str__(self) -> str:  # one line, always
        return self.one_line()


class ConfigError(AiosError):
    """Invalid configuration (unknown key, wrong type, bad enum value)."""


class BackendUnavailable(AiosError):
    """A requested backend cannot run here (never silently replaced by another)."""


class PluginError(AiosError):
    """A plugin failed to load, or two plugins claim one name (strict mode raises these)."""


class CheckpointError(AiosError):
    """A checkpoint directory is unwritable, or holds a corrupt or partial checkpoint."""


class LaunchError(AiosError):
    """A launch cannot proceed (port in use, bad process count, missing script)."""


class PeerFailed(CheckpointError):
    """This rank's part of a collective operation (a save, a resume) succeeded, another rank's
    failed. That rank prints the one line; this one stops without printing (``quiet``), with
    the same exit status, and ``aios-run`` never blames it."""

    quiet = True


def error_line(exc: BaseException) -> str:
    """One line for ``exc``: an aios error's own line, else ``Type: first line``."""
    if isinstance(exc, AiosError):
        return exc.one_line()
    return os_cause(exc)


def settle(
    outcomes: list[tuple[bool, str] | None],
    rank: int,
    error: BaseException | None,
    what: str,
    fix: str = "check that checkpoint.dir is writable and has free space",
) -> None:
    """End of a collective step whose outcome every rank gathered (``outcomes[r]``: ``None``
    when rank r succeeded, else ``(own, line)``; ``own`` False for a rank that only learned of
    another's failure). When any rank failed, the lowest rank that failed on its own raises
    its error (an aios error as it is, anything else as ``what failed (cause)``) and every
    other rank raises :class:`PeerFailed` naming that rank: one line in all, from the rank
    where it happened."""
    failed = [(r, o) for r, o in enumerate(outcomes) if o is not None]
    if not failed:
        return
    own = [(r, o) for r, o in failed if o[0]] or failed
    first, (_, line) = own[0]
    if first == rank and error is not None and not isinstance(error, PeerFailed):
        if isinstance(error, AiosError):
            raise error
        raise CheckpointError(f"{what} failed ({line})", fix) from error
    raise PeerFailed(f"{what} failed on rank {first} ({line})")


def outcome(error: BaseException | None) -> tuple[bool, str] | None:
    """What a rank contributes to :func:`settle`."""
    if error is None:
        return None
    return (not isinstance(error, PeerFailed), error_line(error))


_ERRNO = re.compile(r"\[Errno (\d+)\]")


def os_cause(exc: BaseException) -> str:
    """The cause of a failed write as the OS gave it ("No space left on device [ENOSPC]",
    "Permission denied [EACCES]", "Disk quota exceeded [EDQUOT]"), found anywhere in the
    exception's chain or, from DCP's checkpoint process, in its text; torch's zip writer and DCP
    wrap it in their own messages (``unexpected pos 91648 vs 91552``). Otherwise the exception's
    own first line."""
    seen: set[int] = set()
    todo: list[Any] = [exc]
    texts: list[str] = []
    while todo:
        e = todo.pop(0)
        if isinstance(e, tuple) and e and isinstance(e[0], BaseException):
            e = e[0]  # DCP's (exception, traceback) per failed rank
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno:
            return f"{e.strerror or os.strerror(e.errno)} [{errno.errorcode.get(e.errno, e.errno)}]"
        texts.append(str(e))
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            todo.extend(failures.values())
        todo.extend(x for x in (e.__cause__, e.__context__) if x is not None)
    for text in texts:
        m = _ERRNO.search(text)
        if m and int(m.group(1)) in errno.errorcode:
            n = int(m.group(1))
            return f"{os.strerror(n)} [{errno.errorcode[n]}]"
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:200] if lines else ''}"
