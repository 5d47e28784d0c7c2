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

import html
import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CATEGORIES",
    "Attempt",
    "Report",
    "write_event",
    "read_attempts",
    "resolve",
    "account",
    "render_text",
    "render_html",
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
        from aios.checkpoint.store import CheckpointStore

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


# ------------------------------------------------------------------------------ rendering

_LABELS = {
    "productive": "productive steps",
    "capacity_wait": "waiting for capacity",
    "provisioning": "provisioning and setup",
    "startup": "start-up to the first step",
    "checkpoint": "checkpoints (blocking)",
    "rework": "rework after a resume",
    "hung": "hung",
    "shutdown": "shutdown",
    "between_attempts": "between attempts",
}
_COLORS = {
    "productive": "#2e7d32",
    "capacity_wait": "#8e24aa",
    "provisioning": "#5e35b1",
    "startup": "#f9a825",
    "checkpoint": "#1e88e5",
    "rework": "#e53935",
    "hung": "#6d4c41",
    "shutdown": "#90a4ae",
    "between_attempts": "#bdbdbd",
}


def _dur(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.1f}h"
    if s >= 60:
        return f"{s / 60:.1f}m"
    return f"{s:.1f}s"


def render_text(r: Report) -> list[str]:
    runs = ""
    if r.separate_runs > 1:
        runs = (
            f" in {r.separate_runs} separate runs ({_dur(r.idle_s)} idle between them is not "
            "counted)"
        )
    lines = [
        f"goodput {r.goodput:.1%}: {_dur(r.seconds['productive'])} productive of "
        f"{_dur(r.wall_s)} wall, {len(r.attempts)} attempt(s){runs}"
    ]
    for k in CATEGORIES[1:]:
        v = r.seconds[k]
        if v > 0.0005 * max(r.wall_s, 1e-9):
            lines.append(f"  {_LABELS[k]:<28} {_dur(v):>8}  {v / r.wall_s:6.1%}")
    for it in r.interruptions:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(it["time"])))
        lines.append(
            f"  interrupted {when} UTC by {it['source']} at step {it['step']}: resumed at "
            f"step {it['resumed_at']}, {it['steps_lost']} step(s) lost; cost "
            f"{_dur(it['cost_s'])} ({_dur(it['work_lost_s'])} of work redone, "
            f"{_dur(it['restart_s'])} to restart)"
        )
    return lines


Line = list[tuple[float, float]]

#: colours of the loss series, in the order their names first appear
_LOSS_COLORS = ("#c2185b", "#00838f", "#ef6c00", "#546e7a", "#7b1fa2", "#827717")
#: the marks drawn on the timeline: kind -> (colour, dash pattern, legend text)
_MARKS = {
    "attempt": ("#f9a825", "4,3", "an attempt starts"),
    "run": ("#424242", "", "a separate run starts (idle time before it left out)"),
    "checkpoint": ("#1e88e5", "2,3", "checkpoint written"),
    "interruption": ("#e53935", "6,2", "interrupted"),
    "hang": ("#6d4c41", "1,2", "hang named by the watchdog"),
    "span": ("#8e24aa", "8,3", "a capacity wait or provisioning begins"),
}
_RESTART_FILL = "#ffcdd2"
#: the events chart's row names
_LANES = {
    "attempt": "attempts",
    "run": "separate runs",
    "checkpoint": "checkpoints",
    "interruption": "interruptions",
    "hang": "hangs",
    "span": "cloud spans",
}


def _is_loss(name: str) -> bool:
    """A metric the script logs as its loss: ``loss``, ``train/loss``, ``val/loss``, ``loss/x``
    (any ``/``-separated part named ``loss``)."""
    return "loss" in name.split("/")


def _run_time(r: Report, t: float) -> float:
    """Seconds of the account's wall time from its start to the epoch time ``t`` (the idle time
    between separate runs left out)."""
    off = 0.0
    for a, b in r.idle:
        off += max(0.0, min(t, b) - a)
    return t - r.start - off


def _series(r: Report) -> tuple[list[Line], dict[str, list[Line]]]:
    """Steps/s over time (seconds of wall time from the start), one line per attempt; each loss
    the script logs (:func:`_is_loss`) by its name, one line per attempt."""
    rate: list[Line] = []
    loss: dict[str, list[Line]] = {}
    for a in r.attempts:
        prev = None
        ra: Line = []
        lo: dict[str, Line] = {}
        for m in a.metrics:
            t = _run_time(r, float(m.get("time", 0.0)))
            for k, v in m.items():
                if _is_loss(k) and isinstance(v, (int, float)) and math.isfinite(v):
                    lo.setdefault(k, []).append((t, float(v)))
            if prev is not None and t > prev[0] and m.get("step", 0) > prev[1]:
                ra.append((t, (m["step"] - prev[1]) / (t - prev[0])))
            prev = (t, m.get("step", 0))
        rate.append(ra)
        for k, line in lo.items():
            loss.setdefault(k, []).append(line)
    return rate, loss


def _nice(step: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at least ``step``."""
    if step <= 0:
        return 1.0
    e = 10 ** math.floor(math.log10(step))
    return next(m * e for m in (1, 2, 5, 10) if m * e >= step * (1 - 1e-9))


def _time_ticks(span: float) -> tuple[list[float], str]:
    """Tick positions over [0, span] seconds and the unit they are written in."""
    steps = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200)
    step = next((s for s in steps if span / s <= 8), 86400 * _nice(span / 8 / 86400))
    ticks, t = [], 0.0
    while t <= span + 1e-9:
        ticks.append(t)
        t += step
    return ticks, ("h:mm" if span >= 3600 else "m:ss")


def _clock(t: float, unit: str) -> str:
    t = round(t)
    if unit == "h:mm":
        return f"{t // 3600}:{t % 3600 // 60:02d}"
    return f"{t // 60}:{t % 60:02d}"


def _swatch(color: str, dash: str = "", band: bool = False) -> str:
    if band:
        return (
            f'<svg width="24" height="12"><rect x="0" y="0" width="24" height="12" '
            f'fill="{color}"/></svg>'
        )
    d = f' stroke-dasharray="{dash}"' if dash else ""
    return (
        f'<svg width="24" height="12"><line x1="0" y1="6" x2="24" y2="6" stroke="{color}" '
        f'stroke-width="2"{d}/></svg>'
    )


def render_html(r: Report, title: str = "aios run") -> str:
    """One self-contained page (inline SVG, no external assets, no script): where the time went,
    steps/s and each loss the script logs over time with the events marked on the same time
    axis (each chart with a legend for every line and mark), and what each interruption cost."""
    W, H, L, R_, T, B = 960, 240, 100, 20, 12, 44  # noqa: N806 - the chart geometry
    span = max(r.wall_s, 1e-9)
    ticks, unit = _time_ticks(span)

    def x(t: float) -> float:
        return L + (W - L - R_) * max(0.0, min(t, span)) / span

    # the marks: (run time, kind, tooltip)
    marks: list[tuple[float, str, str]] = []
    starts = set(r.run_starts)
    for i, a in enumerate(r.attempts):
        t = _run_time(r, a.launched)
        if i in starts:
            prev_end = r.attempts[i - 1].end
            before = sum(
                b - a_ for a_, b in r.idle if a_ >= prev_end - 1e-6 and b <= a.launched + 1e-6
            )
            marks.append((t, "run", f"a separate run starts ({_dur(before)} idle left out)"))
        marks.append((t, "attempt", f"attempt {i + 1} starts ({a.run_dir})"))
        for c in a.checkpoints:
            if "time" in c:
                marks.append(
                    (
                        _run_time(r, float(c["time"])),
                        "checkpoint",
                        f"checkpoint, step {c.get('step')}",
                    )
                )
        for h in a.hangs:
            marks.append((_run_time(r, float(h["time"])), "hang", "hang named by the watchdog"))
    for it in r.interruptions:
        marks.append(
            (
                _run_time(r, float(it["time"])),
                "interruption",
                f"interrupted: {it['source']}, step {it['step']}",
            )
        )
    for s in r.spans:
        marks.append((_run_time(r, float(s["start"])), "span", f"{s.get('kind')} begins"))
    bands = [
        (_run_time(r, float(it["restart_from"])), _run_time(r, float(it["restart_to"])))
        for it in r.interruptions
        if float(it["restart_to"]) > float(it["restart_from"])
    ]

    def chart(
        name: str, ylabel: str, series: list[tuple[str, str, list[Line]]], pad_zero: bool
    ) -> str:
        points = [p for _, _, lines in series for line in lines for p in line]
        if not points:
            return (
                f'<h3>{html.escape(name)}</h3><p class="none">no {html.escape(ylabel)} logged '
                "(the page charts metrics named loss, train/loss or any name with a /loss "
                "part)</p>"
                if ylabel == "loss"
                else f'<h3>{html.escape(name)}</h3><p class="none">no {html.escape(ylabel)} '
                "logged</p>"
            )
        hi = max(v for _, v in points)
        lo = min(0.0, min(v for _, v in points)) if pad_zero else min(v for _, v in points)
        if hi - lo <= 0:
            hi, lo = hi + 0.5 * (abs(hi) or 1.0), lo - 0.5 * (abs(lo) or 1.0)
        ystep = _nice((hi - lo) / 4)
        y0 = ystep * int(lo // ystep)
        y1 = y0 + ystep * max(1, -int(-(hi - y0) // ystep))

        def y(v: float) -> float:
            return T + (H - T - B) * (1 - (v - y0) / ((y1 - y0) or 1.0))

        out = [
            f'<svg class="chart" width="{W}" height="{H}" role="img" '
            f'aria-label="{html.escape(name)}">',
            f'<rect x="{L}" y="{T}" width="{W - L - R_}" height="{H - T - B}" fill="#fafafa" '
            'stroke="#ccc"/>',
        ]
        for b0, b1 in bands:
            out.append(
                f'<rect x="{x(b0):.1f}" y="{T}" width="{max(x(b1) - x(b0), 1):.1f}" '
                f'height="{H - T - B}" fill="{_RESTART_FILL}" opacity="0.7"/>'
            )
        v = y0
        while v <= y1 + ystep * 1e-6:
            yy = y(v)
            out.append(
                f'<line x1="{L - 4}" x2="{W - R_}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#eee"/>'
                f'<text x="{L - 6}" y="{yy + 4:.1f}" font-size="11" text-anchor="end">'
                f"{v:.4g}</text>"
            )
            v += ystep
        out.append(axis(H - B))
        out.append(
            f'<text class="ylabel" transform="translate(14,{T + (H - T - B) / 2:.0f}) '
            f'rotate(-90)" font-size="12" text-anchor="middle">{html.escape(ylabel)}</text>'
        )
        for t, kind, tip in marks:
            color, dash, _ = _MARKS[kind]
            d = f' stroke-dasharray="{dash}"' if dash else ""
            xe = x(t)
            out.append(
                f'<line class="mark-{kind}" x1="{xe:.1f}" x2="{xe:.1f}" y1="{T}" y2="{H - B}" '
                f'stroke="{color}" stroke-width="{2 if kind == "run" else 1.5}"{d}>'
                f"<title>{html.escape(tip)}</title></line>"
            )
        for label, color, lines in series:
            for line in lines:
                if line:
                    pts = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in line)
                    out.append(
                        f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{pts}">'
                        f"<title>{html.escape(label)}</title></polyline>"
                    )
        out.append("</svg>")
        items = [(label, _swatch(color)) for label, color, lines in series if any(lines)]
        return f"<h3>{html.escape(name)}</h3>{''.join(out)}{mark_legend(items, dashed=True)}"

    def mark_legend(items: list[tuple[str, str]], dashed: bool) -> str:
        """The legend of a chart: ``items`` (its lines), then every kind of mark drawn."""
        items = list(items)
        for kind in _MARKS:
            if any(k == kind for _, k, _ in marks):
                color, dash, text = _MARKS[kind]
                items.append((text, _swatch(color, dash if dashed else "")))
        if bands:
            items.append(("restart after an interruption", _swatch(_RESTART_FILL, band=True)))
        if r.spans and not dashed:
            items.append(("a cloud span's length", _swatch(_MARKS["span"][0], band=True)))
        lis = "".join(f'<li class="legend-item">{sw}{html.escape(t)}</li>' for t, sw in items)
        return f'<ul class="legend">{lis}</ul>'

    def axis(y_base: float) -> str:
        """The time axis under a plot whose bottom is ``y_base``: ticks and one title."""
        out = []
        for t in ticks:
            xt = x(t)
            out.append(
                f'<line x1="{xt:.1f}" x2="{xt:.1f}" y1="{y_base}" y2="{y_base + 4}" '
                f'stroke="#666"/><text x="{xt:.1f}" y="{y_base + 16}" font-size="11" '
                f'text-anchor="middle">{_clock(t, unit)}</text>'
            )
        out.append(
            f'<text class="xlabel" x="{L + (W - L - R_) / 2:.0f}" y="{y_base + 32}" '
            f'font-size="12" text-anchor="middle">run time ({unit})'
            + (", idle time between separate runs left out" if r.idle else "")
            + "</text>"
        )
        return "".join(out)

    def lanes() -> str:
        """One row per kind of event, so that events at the same moment stay apart."""
        rows = [k for k in _MARKS if any(kind == k for _, kind, _ in marks)]
        row_h = 20
        h = row_h * len(rows) + 6
        out = [
            f'<svg class="chart" id="events" width="{W}" height="{h + B}" role="img" '
            'aria-label="events">',
            f'<rect x="{L}" y="2" width="{W - L - R_}" height="{h - 4}" fill="#fafafa" '
            'stroke="#ccc"/>',
        ]
        for n, kind in enumerate(rows):
            color, dash, text = _MARKS[kind]
            y0 = 4 + n * row_h
            out.append(
                f'<text x="{L - 6}" y="{y0 + 14}" font-size="11" text-anchor="end">'
                f"{_LANES[kind]}</text>"
            )
            if kind == "interruption":
                for b0, b1 in bands:
                    out.append(
                        f'<rect x="{x(b0):.1f}" y="{y0 + 2}" width="{max(x(b1) - x(b0), 1):.1f}" '
                        f'height="{row_h - 4}" fill="{_RESTART_FILL}"/>'
                    )
            if kind == "span":
                for sp in r.spans:
                    s0 = _run_time(r, float(sp["start"]))
                    s1 = _run_time(r, float(sp["end"]))
                    out.append(
                        f'<rect x="{x(s0):.1f}" y="{y0 + 6}" width="{max(x(s1) - x(s0), 1):.1f}" '
                        f'height="{row_h - 12}" fill="{color}" opacity="0.35"/>'
                    )
            for t, k, tip in marks:
                if k == kind:
                    out.append(
                        f'<line class="mark-{k}" x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{y0 + 2}" '
                        f'y2="{y0 + row_h - 2}" stroke="{color}" stroke-width="2">'
                        f"<title>{html.escape(tip)}</title></line>"
                    )
        out.append(axis(h))
        out.append("</svg>")
        return "<h3>events</h3>" + "".join(out) + mark_legend([], dashed=False)

    rate, loss = _series(r)
    loss_series = [
        (name, _LOSS_COLORS[i % len(_LOSS_COLORS)], lines)
        for i, (name, lines) in enumerate(loss.items())
    ]
    bar, pos = [], float(L)
    for k in CATEGORIES:
        w = (W - L - R_) * r.seconds[k] / span
        if w <= 0:
            continue
        bar.append(
            f'<rect x="{pos:.1f}" y="0" width="{w:.1f}" height="36" fill="{_COLORS[k]}">'
            f"<title>{_LABELS[k]}: {_dur(r.seconds[k])}</title></rect>"
        )
        pos += w
    legend = "".join(
        f'<li><span style="background:{_COLORS[k]}"></span>{_LABELS[k]}: {_dur(r.seconds[k])} '
        f"({r.seconds[k] / span:.1%})</li>"
        for k in CATEGORIES
        if r.seconds[k] > 0.0005 * span
    )
    runs = ""
    if r.separate_runs > 1:
        runs = (
            f" in {r.separate_runs} separate runs ({_dur(r.idle_s)} idle between them is "
            "not counted)"
        )
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>"
        "body{font-family:sans-serif;margin:20px;color:#222}"
        "h3{margin:18px 0 4px 0;font-size:15px}"
        "ul{list-style:none;padding:0;margin:4px 0}li{margin:2px 0}"
        "ul.bar{columns:3}ul.bar li span{display:inline-block;width:12px;height:12px;"
        "margin-right:6px}"
        "ul.legend li{display:inline-block;margin-right:18px;font-size:13px}"
        "ul.legend svg{vertical-align:middle;margin-right:5px}"
        "p.none{color:#666}"
        "td,th{padding:2px 10px;text-align:left}td.n,th.n{text-align:right}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>"
        f"<p><b>goodput {r.goodput:.1%}</b>: {_dur(r.seconds['productive'])} productive of "
        f"{_dur(r.wall_s)} wall over {len(r.attempts)} attempt(s){runs}</p>"
        f'<h2>where the time went</h2><svg width="{W}" height="36" id="bar">{"".join(bar)}</svg>'
        f'<ul class="bar">{legend}</ul><h2>timeline</h2>'
        + lanes()
        + chart("steps per second", "steps/s", [("steps/s", "#2e7d32", rate)], True)
        + chart("loss", "loss", loss_series, False)
        + _interruptions_html(r, W, L, R_)
        + "</body></html>"
    )


def _interruptions_html(r: Report, W: int, L: int, R_: int) -> str:  # noqa: N803
    """What each interruption cost: a bar each (the work redone, the restart) on one scale, and
    the table of figures."""
    if not r.interruptions:
        return "<h2>interruptions</h2><p>no interruptions</p>"
    work_c, restart_c = _COLORS["rework"], "#ff8a65"
    top = max(float(it["cost_s"]) for it in r.interruptions) or 1.0
    rows_h, lab = 26, 200
    width = W - L - R_ - lab
    bars = []
    for n, it in enumerate(r.interruptions):
        yy = n * rows_h
        ww = width * float(it["work_lost_s"]) / top
        wr = width * float(it["restart_s"]) / top
        when = time.strftime("%H:%M:%S", time.gmtime(float(it["time"])))
        bars.append(
            f'<text x="0" y="{yy + 16}" font-size="12">{html.escape(when)} '
            f"{html.escape(str(it['source'])[:24])}</text>"
            f'<rect x="{lab}" y="{yy + 4}" width="{ww:.1f}" height="16" fill="{work_c}">'
            f"<title>work redone: {_dur(float(it['work_lost_s']))}</title></rect>"
            f'<rect x="{lab + ww:.1f}" y="{yy + 4}" width="{wr:.1f}" height="16" '
            f'fill="{restart_c}"><title>restart: {_dur(float(it["restart_s"]))}</title></rect>'
            f'<text x="{lab + ww + wr + 6:.1f}" y="{yy + 16}" font-size="12">'
            f"{_dur(float(it['cost_s']))}</text>"
        )
    svg = (
        f'<svg id="costs" width="{W}" height="{rows_h * len(r.interruptions) + 4}">'
        + "".join(bars)
        + "</svg>"
    )
    legend = (
        '<ul class="legend">'
        f'<li class="legend-item">{_swatch(work_c, band=True)}work redone (the steps since the '
        "checkpoint resumed, run again)</li>"
        f'<li class="legend-item">{_swatch(restart_c, band=True)}restart (from the last step '
        "to the next attempt's first step)</li></ul>"
    )
    rows = "".join(
        f"<tr><td>{html.escape(time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(float(i['time']))))}"
        f"</td><td>{html.escape(str(i['source']))}</td><td class='n'>{i['step']}</td>"
        f"<td class='n'>{i['resumed_at']}</td><td class='n'>{i['steps_lost']}</td>"
        f"<td class='n'>{_dur(float(i['work_lost_s']))}</td>"
        f"<td class='n'>{_dur(float(i['restart_s']))}</td>"
        f"<td class='n'><b>{_dur(float(i['cost_s']))}</b></td></tr>"
        for i in r.interruptions
    )
    table = (
        "<table><tr><th>when (UTC)</th><th>source</th><th class='n'>step</th>"
        "<th class='n'>resumed at</th><th class='n'>steps lost</th><th class='n'>work redone</th>"
        "<th class='n'>restart</th><th class='n'>cost</th></tr>" + rows + "</table>"
    )
    return f"<h2>interruptions: what each cost</h2>{svg}{legend}{table}"
