"""Goodput: what a run's wall time went to, over every attempt, restart and recovery.

The account is read from run records (:mod:`aios.runrecord.records`); nothing here imports torch.

Categories (seconds; with ``productive`` they add up to the wall time):

* ``capacity_wait``: waiting for capacity (a cloud queue, a stockout), from cloud events;
* ``provisioning``: creating machines and setting them up, from cloud events;
* ``startup``: from an attempt's launch to the end of its first step (imports, rendezvous,
  resume, compilation);
* ``productive``: optimizer steps that were not run before;
* ``checkpoint``: time a save blocked training (a background save's overlap is productive);
* ``rework``: steps run again after a resume (the work an interruption lost);
* ``hung``: time the watchdog saw no progress before it named a hang;
* ``shutdown``: from the last step to the end of an attempt (besides saves);
* ``between_attempts``: from the end of an interrupted attempt to the launch of the next,
  besides cloud events (relaunch latency, a killed attempt's unrecorded tail).

``goodput`` is ``productive / wall``.

Separate runs. An attempt whose script ended by itself (status ``finished``; ``exited``, the
script ended without ``rt.close()``, when the next attempt is a new launch with its own run
record) was not interrupted: a later run that resumes its checkpoint is a separate run of the
same training. The idle time between two separate runs is badput of neither and is left out
of the wall time (``idle_between_runs_s``); a capacity wait or provisioning for the later run
(cloud spans in that gap) still counts, from the span's start. Every other change of attempt
is an interruption, and its cost is listed: the work it lost (the re-run of the steps done
since the checkpoint resumed, ``rework``) and the restart (from the interrupted attempt's last
step to the next attempt's first step).

Where the figures come from. Each attempt's ``diagnostics.json`` holds ``attempt`` (wall-clock
launch, first and last step, steps at start and end, end), its checkpoints (each with
``blocking_seconds`` and ``time``), its preemptions and a ``resume`` event naming the run record
that wrote the checkpoint it resumed (``record``): following those links from the newest record
gives every attempt of the run, even when ``checkpoint.keep`` pruned their checkpoints. A restart
under ``aios-run --max-restarts`` keeps its predecessors in ``previous_attempts``. Hangs come from
the watchdog's ``watchdog/hang-<n>.json`` (``time``, ``idle_s``).

Events of other parts (the cloud launcher: capacity waits, provisioning) go into the run
record's ``events.jsonl`` through :func:`write_event`: one JSON object per line,
``{"kind": KIND, "start": EPOCH_S, "end": EPOCH_S, ...}`` for a span, ``{"kind": KIND, "time":
EPOCH_S, ...}`` for a moment. Span kinds counted: ``capacity_wait`` and ``provisioning`` (any
other span kind is drawn on the timeline and counted as ``provisioning`` when it is ``setup``).
A span may cover time before the first attempt (it then extends the wall time) or between
attempts.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

from aios.checkpoint.store import CheckpointStore

__all__ = [
    "CATEGORIES",
    "Attempt",
    "Report",
    "write_event",
    "read_attempts",
    "resolve",
    "account",
]

#: categories in display order (``productive`` first: the goodput)
CATEGORIES = (
    "productive",
    "capacity_wait",
    "provisioning",
    "startup",
    "checkpoint",
    "rework",
    "hung",
    "shutdown",
    "between_attempts",
)
#: span kinds of ``events.jsonl`` and the category they count in
SPAN_KINDS = {
    "capacity_wait": "capacity_wait",
    "provisioning": "provisioning",
    "setup": "provisioning",
}
EVENTS_FILE = "events.jsonl"


def write_event(run_dir: str, kind: str, **data: Any) -> None:
    """Append one event to ``<run_dir>/events.jsonl`` (a span: ``start=``, ``end=`` epoch
    seconds; a moment: ``time=``, default now). For launchers and cloud plugins: a capacity
    wait, provisioning, an interruption the cloud saw. One line, appended and flushed."""
    if "start" not in data and "time" not in data:
        data["time"] = time.time()
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, EVENTS_FILE), "a") as f:
        f.write(json.dumps({"kind": kind, **data}, default=str) + "\n")


@dataclass
class Attempt:
    """One attempt (a start of the training processes) as its run record saw it."""

    run_dir: str
    launched: float
    first_step: float | None
    last_step: float | None
    end: float
    start_step: int
    last_step_index: int
    status: str
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    preemptions: list[dict[str, Any]] = field(default_factory=list)
    hangs: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    predecessor: str | None = None

    def ends_run_before(self, nxt: Attempt) -> bool:
        """Whether ``nxt`` is a separate run after this attempt rather than a restart: this
        attempt's script ended by itself (``finished``, or ``exited`` without ``rt.close()``
        with ``nxt`` launched anew, in its own run record; a launcher's restart keeps the run
        record)."""
        return self.status == "finished" or (
            self.status == "exited"
            and os.path.abspath(nxt.run_dir) != os.path.abspath(self.run_dir)
        )


@dataclass
class Report:
    wall_s: float
    seconds: dict[str, float]
    start: float
    end: float
    attempts: list[Attempt]
    interruptions: list[dict[str, Any]]
    spans: list[dict[str, Any]]
    #: (start, end) epoch seconds between separate runs: in no category, not in ``wall_s``
    idle: list[tuple[float, float]] = field(default_factory=list)

    @property
    def idle_s(self) -> float:
        return sum(b - a for a, b in self.idle)

    @property
    def separate_runs(self) -> int:
        """Separate runs (launches that did not follow an interruption)."""
        return len(self.run_starts) + 1 if self.attempts else 0

    @property
    def run_starts(self) -> list[int]:
        """Indexes of the attempts that start a separate run (after the first)."""
        return [
            i + 1
            for i, (a, b) in enumerate(zip(self.attempts, self.attempts[1:], strict=False))
            if a.ends_run_before(b)
        ]

    @property
    def goodput(self) -> float:
        return self.seconds["productive"] / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def badput(self) -> dict[str, float]:
        return {k: v for k, v in self.seconds.items() if k != "productive"}

    def to_dict(self) -> dict[str, Any]:
        """``wall_s``, ``goodput`` (fraction), ``productive_s``, ``badput`` (seconds by cause):
        ``goodput * wall_s + sum(badput) == wall_s``."""
        return {
            "wall_s": round(self.wall_s, 3),
            "goodput": round(self.goodput, 6),
            "productive_s": round(self.seconds["productive"], 3),
            "badput": {k: round(v, 3) for k, v in self.badput.items()},
            "attempts": len(self.attempts),
            "interruptions": self.interruptions,
            "start": self.start,
            "end": self.end,
            "runs": [a.run_dir for a in self.attempts],
            "separate_runs": self.separate_runs,
            "idle_between_runs_s": round(self.idle_s, 3),
        }


# ------------------------------------------------------------------------------ reading


def _read_json(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _read_lines(path: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue  # a torn last line of a killed run
                if isinstance(obj, dict):
                    out.append(obj)
    except OSError:
        pass
    return out


def _attempt(run_dir: str, diag: dict[str, Any], metrics: list[dict[str, Any]]) -> Attempt:
    a = diag.get("attempt") or {}
    launched = float(a.get("launched") or diag.get("started") or 0.0)
    resume = [e for e in diag.get("events", []) if e.get("kind") == "resume"]
    start_step = int(a.get("start_step", resume[-1]["step"] if resume else 0) or 0)
    known = [launched, float(diag.get("updated") or 0.0)]
    known += [float(m["time"]) for m in metrics[-1:] if "time" in m]
    finished = diag.get("finished")
    end = float(finished) if finished else max(known)
    last = a.get("last_step")
    hangs = []
    wd = os.path.join(run_dir, "watchdog")
    if os.path.isdir(wd):
        for name in sorted(os.listdir(wd)):
            if name.startswith("hang-") and name.endswith(".json"):
                h = _read_json(os.path.join(wd, name)) or {}
                if "time" in h and h["time"] >= launched - 1 and h["time"] <= end + 60:
                    hangs.append(h)
    if hangs:
        end = max(end, max(float(h["time"]) for h in hangs))
    pred = None
    for e in resume:
        pred = e.get("record") or pred
    metrics = [m for m in metrics if m.get("time", 0) >= launched - 1]
    last_index = int(a.get("last_step_index", diag.get("steps", start_step)) or 0)
    if not finished:
        # killed: the record was last written at a checkpoint; the metrics logged since then
        # say how far it got (the work the interruption lost)
        logged = [m for m in metrics if isinstance(m.get("step"), int) and "time" in m]
        if logged and logged[-1]["step"] > last_index:
            last_index, last = logged[-1]["step"], float(logged[-1]["time"])
    return Attempt(
        run_dir=run_dir,
        launched=launched,
        first_step=a.get("first_step"),
        last_step=float(last) if last is not None else None,
        end=max(end, float(last or 0.0)),
        start_step=start_step,
        last_step_index=last_index,
        status=str(diag.get("status", "killed" if not finished else "?")),
        checkpoints=list(diag.get("checkpoints", [])),
        preemptions=list(diag.get("preemptions", [])),
        hangs=hangs,
        metrics=metrics,
        predecessor=pred,
    )


def read_attempts(run_dir: str) -> list[Attempt]:
    """Every attempt of the run whose newest record is ``run_dir``, oldest first (following
    ``resume`` links to the records that wrote the checkpoints resumed, and the restarts kept in
    ``previous_attempts``)."""
    out: list[Attempt] = []
    seen: set[str] = set()
    cur: str | None = os.path.abspath(run_dir)
    while cur and cur not in seen and os.path.isfile(os.path.join(cur, "diagnostics.json")):
        seen.add(cur)
        diag = _read_json(os.path.join(cur, "diagnostics.json")) or {}
        metrics = _read_lines(os.path.join(cur, "metrics.jsonl"))
        # a restart's predecessors share the metrics file: each reads what it logged
        entries = [*diag.get("previous_attempts", []), diag]
        launches = [
            float((e.get("attempt") or {}).get("launched") or e.get("started") or 0.0)
            for e in entries
        ]
        here = []
        for k, e in enumerate(entries):
            upto = launches[k + 1] if k + 1 < len(entries) else math.inf
            here.append(_attempt(cur, e, [m for m in metrics if m.get("time", 0) < upto]))
        out = here + out
        cur = here[0].predecessor
        if cur is not None and not os.path.isabs(cur):
            cur = os.path.abspath(os.path.join(os.path.dirname(run_dir), os.path.basename(cur)))
    return out


def _newest_successor(rec: str) -> str:
    """The newest run record beside ``rec`` (in the same ``logging.run_dir``) that resumed from a
    checkpoint ``rec`` wrote and wrote none itself (it trained nothing, or stopped before its
    first save), followed on; ``rec`` when there is none."""
    seen = {os.path.abspath(rec)}
    cur = os.path.abspath(rec)
    root = os.path.dirname(cur)
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return rec
    resumed: dict[str, tuple[float, str]] = {}  # predecessor -> (started, newest successor)
    for name in names:
        d = os.path.join(root, name)
        diag = _read_json(os.path.join(d, "diagnostics.json"))
        if not isinstance(diag, dict):
            continue
        wrote = [diag, *diag.get("previous_attempts", [])]
        if any(e.get("checkpoints") for e in wrote if isinstance(e, dict)):
            continue  # it wrote checkpoints (elsewhere, or it would be their record)
        for e in diag.get("events", []):
            pred = e.get("record") if e.get("kind") == "resume" else None
            if isinstance(pred, str):
                started = float(diag.get("started") or 0.0)
                key = os.path.abspath(pred)
                if key not in resumed or started > resumed[key][0]:
                    resumed[key] = (started, d)
    while cur in resumed and resumed[cur][1] not in seen:
        cur = resumed[cur][1]
        seen.add(cur)
    return cur


def resolve(target: str) -> str:
    """A run record directory from ``target``: a run record, or a checkpoint directory (the
    record that wrote its newest checkpoint, or the newest record beside it that resumed from
    that checkpoint and wrote none: a run that had nothing left to train is part of the same
    training). Raises ValueError with the fix."""
    if os.path.isfile(os.path.join(target, "diagnostics.json")):
        return target
    if os.path.isdir(target) or "://" in target:
        try:
            info = CheckpointStore(target, keep=None).latest(warn=False)
        except Exception as exc:  # noqa: BLE001 - one line below
            raise ValueError(f"cannot read checkpoints in '{target}' ({exc})") from None
        if info is not None:
            rec = info.meta.get("record")
            if rec and os.path.isfile(os.path.join(rec, "diagnostics.json")):
                return _newest_successor(str(rec))
            raise ValueError(
                f"the newest checkpoint in '{target}' names no run record on this machine "
                f"({rec or 'written by an older aios'}): pass the run record directory instead"
            )
    raise ValueError(
        f"'{target}' is neither a run record (no diagnostics.json) nor a checkpoint directory: "
        "pass logging.run_dir/<run id> or checkpoint.dir"
    )


# ------------------------------------------------------------------------------ the account


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def _interruptions(
    attempts: list[Attempt], steps_at: list[tuple[float, float]], reworked: list[float]
) -> list[dict[str, Any]]:
    """Each change of attempt that was not a separate run, with what it cost: the work redone
    (``reworked``: each attempt's rework seconds) and the restart, from the interrupted
    attempt's last step to the next one's first (``steps_at``: each attempt's first and last
    step)."""
    interruptions: list[dict[str, Any]] = []
    for i, (a, nxt) in enumerate(zip(attempts, attempts[1:], strict=False)):
        if a.ends_run_before(nxt):
            continue  # a separate run: nothing was interrupted
        pre = a.preemptions[-1] if a.preemptions else None
        if pre is not None:
            source, when = str(pre.get("source") or pre.get("reason")), pre.get("time", a.end)
        elif a.hangs:
            source, when = "hang (watchdog)", a.hangs[-1]["time"]
        elif a.status == "failed":
            source, when = "the script failed", a.end
        else:
            source, when = "unannounced (killed)", a.end
        # the restart: from the last step of the interrupted attempt to the next one's first
        r0, r1 = steps_at[i][1], steps_at[i + 1][0]
        work, restart = reworked[i + 1], max(0.0, r1 - r0)
        interruptions.append(
            {
                "time": when,
                "source": source,
                "status": a.status,
                "step": a.last_step_index,
                "resumed_at": nxt.start_step,
                "steps_lost": max(0, a.last_step_index - nxt.start_step),
                "work_lost_s": round(work, 3),
                "restart_s": round(restart, 3),
                "cost_s": round(work + restart, 3),
                "restart_from": r0,
                "restart_to": r1,
            }
        )
    return interruptions


def account(attempts: list[Attempt], spans: list[dict[str, Any]] | None = None) -> Report:
    """The account of ``attempts`` (oldest first) and the cloud ``spans``: seconds by category
    adding up to the wall time (idle time between separate runs left out), interruptions listed
    with their cost."""
    spans = [s for s in spans or [] if "start" in s and "end" in s and s["end"] >= s["start"]]
    counted = [s for s in spans if SPAN_KINDS.get(str(s.get("kind")))]
    sec = dict.fromkeys(CATEGORIES, 0.0)
    if not attempts:
        return Report(0.0, sec, 0.0, 0.0, [], [], spans)
    start = min([attempts[0].launched] + [float(s["start"]) for s in spans])
    end = max(a.end for a in attempts)
    # before the first attempt and between attempts: cloud spans, else between_attempts; the
    # time between separate runs counts only from the later run's first span
    idle: list[tuple[float, float]] = []
    gaps = [(start, attempts[0].launched, False)]
    gaps += [
        (a.end, b.launched, a.ends_run_before(b))
        for a, b in zip(attempts, attempts[1:], strict=False)
    ]
    for g0, g1, separate in gaps:
        if g1 <= g0:
            continue
        if separate:
            s0 = min(
                (
                    max(g0, float(s["start"]))
                    for s in counted
                    if _overlap(g0, g1, float(s["start"]), float(s["end"])) > 0
                ),
                default=g1,
            )
            if s0 > g0:
                idle.append((g0, s0))
            g0 = s0
        covered = 0.0
        for s in counted:
            cat = SPAN_KINDS[str(s.get("kind"))]
            o = _overlap(g0, g1, float(s["start"]), float(s["end"]))
            o = min(o, g1 - g0 - covered)
            sec[cat] += o
            covered += o
        sec["between_attempts"] += (g1 - g0) - covered
    best = 0  # the furthest step any earlier attempt reached
    steps_at: list[tuple[float, float]] = []  # each attempt's first and last step, clipped
    reworked: list[float] = []  # each attempt's rework seconds
    for i, a in enumerate(attempts):
        if i and a.launched < attempts[i - 1].end:  # a restart under one launcher's launch time
            a.launched = attempts[i - 1].end
        first = a.first_step if a.first_step is not None else a.end
        first = min(max(first, a.launched), a.end)
        last = min(max(a.last_step if a.last_step is not None else first, first), a.end)
        steps_at.append((first, last if a.last_step is not None else a.end))
        startup, steps, tail = first - a.launched, last - first, a.end - last
        # hung time: the watchdog's idle period before it named a hang
        for h in a.hangs:
            h1 = float(h["time"])
            h0 = h1 - float(h.get("idle_s", 0.0))
            for part in ("startup", "steps", "tail"):
                p0, p1 = {
                    "startup": (a.launched, first),
                    "steps": (first, last),
                    "tail": (last, a.end),
                }[part]
                o = _overlap(h0, h1, p0, p1)
                sec["hung"] += o
                if part == "startup":
                    startup -= o
                elif part == "steps":
                    steps -= o
                else:
                    tail -= o
        for c in a.checkpoints:
            b = float(c.get("blocking_seconds", c.get("seconds", 0.0)) or 0.0)
            t = float(c.get("time", last))
            if t <= last + 1e-6:
                b = min(b, steps)
                steps -= b
            else:
                b = min(b, tail)
                tail -= b
            sec["checkpoint"] += b
        n = a.last_step_index - a.start_step - 1  # steps in [first, last]
        redo = max(0, min(best, a.last_step_index) - a.start_step)
        rework = 0.0
        if n > 0 and redo:
            rework = min(steps, steps * min(redo, n) / n)
            sec["rework"] += rework
            steps -= rework
        reworked.append(max(rework, 0.0))
        sec["startup"] += max(startup, 0.0)
        sec["productive"] += max(steps, 0.0)
        sec["shutdown"] += max(tail, 0.0)
        best = max(best, a.last_step_index)
    interruptions = _interruptions(attempts, steps_at, reworked)
    wall = end - start - sum(b - a for a, b in idle)
    # what rounding or overlapping records leave: into between_attempts, so the sum is the wall
    rest = wall - sum(sec.values())
    sec["between_attempts"] = max(0.0, sec["between_attempts"] + rest)
    return Report(wall, sec, start, end, attempts, interruptions, spans, idle)


def report_for(target: str) -> Report:
    run_dir = resolve(target)
    attempts = read_attempts(run_dir)
    spans: list[dict[str, Any]] = []
    for d in dict.fromkeys(a.run_dir for a in attempts):
        spans += _read_lines(os.path.join(d, EVENTS_FILE))
    return account(attempts, spans)
