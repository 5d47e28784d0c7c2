"""A preemption met at the step boundary: the emergency checkpoint and the lines that say what
happened (:meth:`aios.runtime.Runtime` exits with :data:`EXIT_PREEMPTED` after it), and when a
known deadline is announced (:func:`notice_lead`)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aios.checkpoint.policy import SAFETY
from aios.resilience.notices import EXIT_PREEMPTED, PreemptionMonitor

if TYPE_CHECKING:
    from aios.checkpoint.manager import CheckpointManager
    from aios.types import Notice


def recent_step_time(stamps: Any) -> float | None:
    """The median of the recent optimizer steps' wall times (None before two steps), from the
    step timer's time stamps."""
    n = min(len(stamps), 33)
    if n < 2:
        return None
    recent = list(itertools.islice(stamps, len(stamps) - n, len(stamps)))
    d = sorted(b - a for a, b in zip(recent, recent[1:], strict=False))
    return d[len(d) // 2]


def notice_lead(ck: CheckpointManager, grace: float, step_time: float | None) -> float:
    """Seconds before a known deadline (``AIOS_RUN_DEADLINE``) at which to announce it: what
    the emergency checkpoint needs by its measured cost (the configured grace until a save
    was measured), two steps to reach the boundary, and a margin."""
    est = ck.cost.estimate(ck.cost_key(False))
    need = est[1] * SAFETY if est is not None else float(grace)
    return need + 2 * (step_time or 0.0) + 5.0


def deferred_line(notice: Notice, ahead: float) -> str:
    """A notice far ahead of its deadline (maintenance announced hours before), said once."""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(notice.deadline or 0))
    return (
        f"aios: notice from {notice.source}: {notice.reason}; the host is gone at {when}: "
        f"training goes on and the emergency checkpoint starts in {ahead:.0f} s"
    )


def emergency(
    preemption: PreemptionMonitor,
    ck: CheckpointManager,
    rank: int,
    step: int,
    checkpoint: Any,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Write the emergency checkpoint for the notice ``preemption`` holds (or a peer's), saying
    why and whether it is written; returns the preemption event for the run record.
    ``checkpoint`` is the config's ``checkpoint`` section (``dir``, ``grace_seconds``)."""
    reason = preemption.reason or "notice on another rank"
    notice = preemption.notice
    left = preemption.time_left()
    when = f", {left:.1f}s before its deadline" if left is not None else ""
    source = f"{notice.source}: " if notice is not None and notice.source not in reason else ""
    say(f"aios: preemption ({source}{reason}{when}) at step {step}")
    event = ck.emergency_save(reason, rank, preemption.elapsed, preemption.time_left)
    event["source"] = notice.source if notice is not None else "peer"
    event["time"] = time.time()
    if notice is not None and notice.deadline is not None:
        event["deadline"] = notice.deadline
    elapsed, grace = event["seconds_since_notice"], checkpoint.grace_seconds
    if elapsed > grace:
        say(
            f"aios: warning: emergency checkpoint took {elapsed:.1f}s, more than "
            f"checkpoint.grace_seconds={grace}"
        )
    if checkpoint.dir and event.get("checkpoint"):
        say(
            f"aios: checkpoint for step {step} written; relaunch the same command to resume "
            f"(exit {EXIT_PREEMPTED})"
        )
    elif not checkpoint.dir:  # with a dir, the manager said which checkpoint is kept
        say(f"aios: no checkpoint.dir configured, progress is lost; exiting with {EXIT_PREEMPTED}")
    return event
