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
        """``message; fix``, with the secrets of any URL in it redacted."""
        from aios.config import redact_url

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
