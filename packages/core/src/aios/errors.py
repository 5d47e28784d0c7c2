"""Errors that end a command with one line and exit status 2 (``--debug`` shows the traceback)."""

from __future__ import annotations


class AiosError(Exception):
    """A user-facing error: ``message`` names the problem, ``fix`` what to do about it."""

    exit_code = 2

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def one_line(self) -> str:
        return f"{self.message}; {self.fix}" if self.fix else self.message

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
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


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
