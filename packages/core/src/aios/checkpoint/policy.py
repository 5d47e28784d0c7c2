"""What a checkpoint costs and when to take one: the measured save cost, the periodic interval
that bounds lost work (``checkpoint.max_lost``) within a saving overhead
(``checkpoint.max_overhead``), and whether an emergency save fits before a notice's deadline.

Pure: every function takes its clock readings as arguments (tests inject them). Nothing here
imports torch.

The bound. A periodic save captures the state at time ``t`` and commits it at ``t + C`` (``C``:
the save's total time, its blocking part ``B`` included; for a background save ``C`` also
covers the write that overlaps training). With saves every ``I`` seconds of training, a kill
just before a commit loses the work since the previous captured state: at most ``I + C`` plus
the step in flight (``S``). So ``I <= max_lost - C - S``. Saving blocks training ``B`` every
``I`` seconds: the overhead ``B / I <= max_overhead`` wants ``I >= B / max_overhead``. The
interval is the largest one that keeps the bound (the fewest saves); when the two bounds
conflict, ``max_lost`` wins and the manager says so once.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

__all__ = ["SaveCost", "Interval", "choose_interval", "parse_duration", "parse_fraction"]

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(s|m|min|h|d)?\s*$", re.IGNORECASE)


def parse_duration(value: object) -> float | None:
    """Seconds from a number or a duration (``90``, ``10s``, ``30m``, ``1.5h``, ``2d``); 0,
    ``off``, ``none`` or None: None (off). Raises ValueError naming the forms it accepts."""
    if value is None or isinstance(value, bool):
        if value is None:
            return None
        raise ValueError("must be seconds or a duration such as 30m, 10s, 2h (or off)")
    if isinstance(value, (int, float)):
        v = float(value)
    else:
        text = str(value).strip().lower()
        if text in ("", "0", "off", "none", "false", "no"):
            return None
        m = _DURATION.match(text)
        if not m:
            raise ValueError(
                f"'{value}' is no duration: use seconds or a duration such as 30m, 10s, 2h (or off)"
            )
        v = float(m.group(1)) * _UNITS[(m.group(2) or "").lower()]
    if not math.isfinite(v) or v < 0:
        raise ValueError("must be a positive number of seconds or a duration such as 30m")
    return v or None


def parse_fraction(value: object) -> float:
    """A fraction from ``0.03`` or ``3%``; in (0, 1)."""
    if isinstance(value, str):
        text = value.strip()
        v = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        v = float(value)
    else:
        raise ValueError("must be a fraction such as 0.03 or a percentage such as 3%")
    if not (0 < v < 1):
        raise ValueError("must be a fraction between 0 and 1 (e.g. 0.03 or 3%)")
    return v


class SaveCost:
    """The running estimate of what a save costs, per format: ``blocking`` (seconds training
    waited) and ``total`` (seconds until the checkpoint was committed), and the bytes written.
    An exponentially weighted mean of the saves measured (the newest weighs ``weight``) and the
    largest seen, so one slow save raises the estimate at once and it decays over later ones."""

    def __init__(self, weight: float = 0.5) -> None:
        self.weight = weight
        self.blocking: dict[str, float] = {}
        self.total: dict[str, float] = {}
        self.count: dict[str, int] = {}
        self.last_total: dict[str, float] = {}

    def add(self, fmt: str, blocking: float, total: float) -> None:
        total = max(total, blocking)
        n = self.count.get(fmt, 0)
        w = 1.0 if n == 0 else self.weight
        b0, t0 = self.blocking.get(fmt, blocking), self.total.get(fmt, total)
        # a save slower than the estimate counts in full: the estimate is what a deadline relies on
        self.blocking[fmt] = blocking if blocking > b0 else b0 + w * (blocking - b0)
        self.total[fmt] = total if total > t0 else t0 + w * (total - t0)
        self.count[fmt] = n + 1
        self.last_total[fmt] = total

    def known(self, fmt: str) -> bool:
        return self.count.get(fmt, 0) > 0

    def estimate(self, fmt: str) -> tuple[float, float] | None:
        """``(blocking, total)`` seconds, or None before the first save of ``fmt``."""
        if not self.known(fmt):
            return None
        return self.blocking[fmt], self.total[fmt]

    def to_dict(self) -> dict[str, dict[str, float]]:
        return {
            f: {
                "blocking_s": round(self.blocking[f], 4),
                "total_s": round(self.total[f], 4),
                "saves": self.count[f],
            }
            for f in self.count
        }


@dataclass(frozen=True)
class Interval:
    """The periodic interval chosen: ``seconds`` of training between saves, the ``overhead``
    it costs (blocking save time / interval), and ``conflict``: max_lost needed more saving
    than max_overhead allows (max_lost won)."""

    seconds: float
    overhead: float
    conflict: bool
    lost_bound: float


def choose_interval(
    max_lost: float,
    max_overhead: float,
    blocking: float | None,
    total: float | None,
    step: float | None,
) -> Interval:
    """The periodic interval for ``max_lost`` (see the module docstring). Before any save was
    measured (``total`` None) the first save comes at half of ``max_lost``, so the bound holds
    while its cost is learned."""
    s = step or 0.0
    if total is None or blocking is None:
        seconds = max(max_lost / 2 - s, 0.0)
        return Interval(seconds, 0.0, False, max_lost)
    upper = max_lost - total - s
    lower = blocking / max_overhead if max_overhead > 0 else math.inf
    if upper <= 0:
        # a save costs more than max_lost: save at every boundary, the bound cannot hold
        return Interval(0.0, 1.0 if blocking else 0.0, True, total + s)
    seconds = upper
    overhead = blocking / seconds if seconds > 0 else 1.0
    return Interval(seconds, min(overhead, 1.0), lower > upper, seconds + total + s)


#: an emergency save is attempted when its estimate times this, plus :data:`MARGIN_S`, fits
SAFETY = 1.25
MARGIN_S = 1.0


def fits(need: float | None, left: float | None) -> bool:
    """Whether a save estimated at ``need`` seconds fits in ``left`` seconds (no deadline:
    yes; no estimate yet: yes while time is left, the only way to learn it)."""
    if left is None:
        return True
    if need is None:
        return left > MARGIN_S
    return need * SAFETY + MARGIN_S <= left
