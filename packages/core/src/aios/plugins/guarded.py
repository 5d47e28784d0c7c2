"""Calls into a plugin, isolated: its stdout/stderr captured (routed per thread), every
exception caught (``SystemExit`` included) and, outside the calling thread, a time limit
(``AIOS_PLUGIN_TIMEOUT``); and the registry's environment switches."""

from __future__ import annotations

import io
import os
import sys
import threading
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aios.errors import ConfigError

TIMEOUT_ENV = "AIOS_PLUGIN_TIMEOUT"
DEFAULT_TIMEOUT = 10.0


def split_env(name: str) -> set[str]:
    return {p.strip() for p in os.environ.get(name, "").split(",") if p.strip()}


def truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def plugin_timeout() -> float | None:
    """Seconds from ``AIOS_PLUGIN_TIMEOUT`` (default 10); ``None`` when disabled (``0``)."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (value >= 0 and value != float("inf")):
        raise ConfigError(
            f"invalid value {raw!r} for {TIMEOUT_ENV} (from environment)",
            "set it to a number of seconds, e.g. 10 (0 disables the limit)",
        )
    return value or None


# ------------------------------------------------------------------------------ output capture
# sys.stdout/sys.stderr are process-wide; while a plugin runs they are replaced by routers that
# send writes from that plugin's thread into its buffer and everything else to the real stream.
_routes: dict[int, io.StringIO] = {}
_routes_lock = threading.Lock()


class _Router:
    def __init__(self, target: Any) -> None:
        self._aios_target = target

    def write(self, text: str) -> int:
        buf = _routes.get(threading.get_ident())
        if buf is not None:
            return buf.write(text)
        return self._aios_target.write(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if threading.get_ident() not in _routes:
            self._aios_target.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._aios_target, name)


def _route(ident: int, buf: io.StringIO | None) -> io.StringIO | None:
    """Send ``ident``'s writes to ``buf`` (``None``: stop); returns the previous buffer."""
    with _routes_lock:
        prev = _routes.pop(ident, None)
        if buf is not None:
            _routes[ident] = buf
        for name in ("stdout", "stderr"):
            cur = getattr(sys, name)
            if _routes and not isinstance(cur, _Router) and cur is not None:
                setattr(sys, name, _Router(cur))
            elif not _routes and isinstance(cur, _Router):
                setattr(sys, name, cur._aios_target)
        return prev


@dataclass
class Outcome:
    value: Any = None
    exc: BaseException | None = None
    tb: str = ""
    output: str = ""
    timed_out: bool = False


def guarded(fn: Callable[[], Any], timeout: float | None, inline: bool = False) -> Outcome:
    """Run ``fn`` with its stdout/stderr captured, every exception caught (``SystemExit``
    included) and, unless ``inline``, in a daemon thread abandoned after ``timeout`` seconds."""
    out = Outcome()
    buf = io.StringIO()

    def target() -> None:
        ident = threading.get_ident()
        prev = _route(ident, buf)
        try:
            out.value = fn()
        except BaseException as exc:  # noqa: BLE001 - a plugin must never end the process
            out.exc, out.tb = exc, traceback.format_exc()
        finally:
            _route(ident, prev)

    if inline or not timeout:
        target()
        if inline and isinstance(out.exc, KeyboardInterrupt):
            raise out.exc
    else:
        t = threading.Thread(target=target, name="aios-plugin", daemon=True)
        t.start()
        t.join(timeout)
        if t.is_alive():
            out.timed_out = True
    out.output = buf.getvalue()
    return out


def one_line(text: str, limit: int = 200) -> str:
    s = " ".join(text.split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def warn(message: str) -> None:
    print(f"aios: warning: {message}", file=sys.stderr, flush=True)
