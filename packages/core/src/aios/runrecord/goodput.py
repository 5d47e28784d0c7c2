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
* ``between_attempts``: from the end of an attempt to the launch of the next, besides cloud
  events (relaunch latency, a killed attempt's unrecorded tail).

``goodput`` is ``productive / wall``.

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


@dataclass
class Report:
    wall_s: float
    seconds: dict[str, float]
    start: float
    end: float
    attempts: list[Attempt]
    interruptions: list[dict[str, Any]]
    spans: list[dict[str, Any]]

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
    return Attempt(
        run_dir=run_dir,
        launched=launched,
        first_step=a.get("first_step"),
        last_step=float(last) if last is not None else None,
        end=max(end, float(last or 0.0)),
        start_step=start_step,
        last_step_index=int(a.get("last_step_index", diag.get("steps", start_step)) or 0),
        status=str(diag.get("status", "killed" if not finished else "?")),
        checkpoints=list(diag.get("checkpoints", [])),
        preemptions=list(diag.get("preemptions", [])),
        hangs=hangs,
        metrics=[m for m in metrics if m.get("time", 0) >= launched - 1],
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
        here = [_attempt(cur, p, metrics) for p in diag.get("previous_attempts", [])]
        here.append(_attempt(cur, diag, metrics))
        out = here + out
        cur = here[0].predecessor
        if cur is not None and not os.path.isabs(cur):
            cur = os.path.abspath(os.path.join(os.path.dirname(run_dir), os.path.basename(cur)))
    return out


def resolve(target: str) -> str:
    """A run record directory from ``target``: a run record, or a checkpoint directory (the
    record that wrote its newest checkpoint). Raises ValueError with the fix."""
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
                return str(rec)
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
    adding up to the wall time, interruptions listed."""
    spans = [s for s in spans or [] if "start" in s and "end" in s and s["end"] >= s["start"]]
    sec = dict.fromkeys(CATEGORIES, 0.0)
    if not attempts:
        return Report(0.0, sec, 0.0, 0.0, [], [], spans)
    start = min([attempts[0].launched] + [float(s["start"]) for s in spans])
    end = max(a.end for a in attempts)
    # before the first attempt and between attempts: cloud spans, else between_attempts
    gaps = [(start, attempts[0].launched)]
    gaps += [(a.end, b.launched) for a, b in zip(attempts, attempts[1:], strict=False)]
    for g0, g1 in gaps:
        if g1 <= g0:
            continue
        covered = 0.0
        for s in spans:
            cat = SPAN_KINDS.get(str(s.get("kind")))
            if cat:
                o = _overlap(g0, g1, float(s["start"]), float(s["end"]))
                o = min(o, g1 - g0 - covered)
                sec[cat] += o
                covered += o
        sec["between_attempts"] += (g1 - g0) - covered
    best = 0  # the furthest step any earlier attempt reached
    interruptions: list[dict[str, Any]] = []
    for i, a in enumerate(attempts):
        if i and a.launched < attempts[i - 1].end:  # a restart under one launcher's launch time
            a.launched = attempts[i - 1].end
        first = a.first_step if a.first_step is not None else a.end
        first = min(max(first, a.launched), a.end)
        last = min(max(a.last_step if a.last_step is not None else first, first), a.end)
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
        if n > 0 and redo:
            rework = min(steps, steps * min(redo, n) / n)
            sec["rework"] += rework
            steps -= rework
        sec["startup"] += max(startup, 0.0)
        sec["productive"] += max(steps, 0.0)
        sec["shutdown"] += max(tail, 0.0)
        if i + 1 < len(attempts):
            nxt = attempts[i + 1]
            pre = a.preemptions[-1] if a.preemptions else None
            if pre is not None:
                source, when = str(pre.get("source") or pre.get("reason")), pre.get("time", a.end)
            elif a.hangs:
                source, when = "hang (watchdog)", a.hangs[-1]["time"]
            else:
                source, when = "unannounced (killed)", a.end
            interruptions.append(
                {
                    "time": when,
                    "source": source,
                    "step": a.last_step_index,
                    "resumed_at": nxt.start_step,
                    "steps_lost": max(0, a.last_step_index - nxt.start_step),
                }
            )
        best = max(best, a.last_step_index)
    wall = end - start
    # what rounding or overlapping records leave: into between_attempts, so the sum is the wall
    rest = wall - sum(sec.values())
    sec["between_attempts"] = max(0.0, sec["between_attempts"] + rest)
    return Report(wall, sec, start, end, attempts, interruptions, spans)


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
    lines = [
        f"goodput {r.goodput:.1%}: {_dur(r.seconds['productive'])} productive of "
        f"{_dur(r.wall_s)} wall, {len(r.attempts)} attempt(s)"
    ]
    for k in CATEGORIES[1:]:
        v = r.seconds[k]
        if v > 0.0005 * max(r.wall_s, 1e-9):
            lines.append(f"  {_LABELS[k]:<28} {_dur(v):>8}  {v / r.wall_s:6.1%}")
    for it in r.interruptions:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(it["time"])))
        lines.append(
            f"  interrupted {when} UTC by {it['source']} at step {it['step']}: resumed at "
            f"step {it['resumed_at']}, {it['steps_lost']} step(s) lost"
        )
    return lines


def _series(r: Report) -> tuple[list[list[tuple[float, float]]], list[list[tuple[float, float]]]]:
    """Steps/s and loss over time (seconds from the start), one line per attempt."""
    rate: list[list[tuple[float, float]]] = []
    loss: list[list[tuple[float, float]]] = []
    for a in r.attempts:
        prev = None
        ra: list[tuple[float, float]] = []
        lo: list[tuple[float, float]] = []
        for m in a.metrics:
            t = float(m.get("time", 0.0)) - r.start
            if isinstance(m.get("loss"), (int, float)):
                lo.append((t, float(m["loss"])))
            if prev is not None and t > prev[0] and m.get("step", 0) > prev[1]:
                ra.append((t, (m["step"] - prev[1]) / (t - prev[0])))
            prev = (t, m.get("step", 0))
        rate.append(ra)
        loss.append(lo)
    return rate, loss


def render_html(r: Report, title: str = "aios run") -> str:
    """One self-contained page (inline SVG, no external assets): steps/s and loss over time,
    the events on the same axis, and a bar of where the time went."""
    W, H, L, R_ = 960, 220, 60, 20  # noqa: N806 - the chart geometry
    span = max(r.wall_s, 1e-9)

    def x(t: float) -> float:
        return L + (W - L - R_) * max(0.0, min(t, span)) / span

    def chart(lines: list[list[tuple[float, float]]], color: str, label: str) -> str:
        points = [p for line in lines for p in line]
        if not points:
            return (
                f'<svg width="{W}" height="{H}"><text x="{L}" y="{H // 2}" '
                f'fill="#666">no {label} logged</text></svg>'
            )
        hi = max(v for _, v in points) or 1.0
        lo = min(0.0, min(v for _, v in points))

        def y(v: float) -> float:
            return H - 25 - (H - 45) * (v - lo) / ((hi - lo) or 1.0)

        polylines = "".join(
            '<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>'.format(
                color, " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in line)
            )
            for line in lines
            if line
        )
        marks = []
        for ev in events:
            xe = x(ev[0])
            marks.append(
                f'<line x1="{xe:.1f}" x2="{xe:.1f}" y1="10" y2="{H - 25}" '
                f'stroke="{ev[2]}" stroke-dasharray="4,3"><title>{html.escape(ev[1])}</title></line>'
            )
        return (
            f'<svg width="{W}" height="{H}" role="img" aria-label="{label}">'
            f'<rect x="{L}" y="10" width="{W - L - R_}" height="{H - 35}" fill="#fafafa" '
            'stroke="#ddd"/>'
            + "".join(marks)
            + polylines
            + f'<text x="4" y="20" font-size="12">{hi:.3g}</text>'
            f'<text x="4" y="{H - 25}" font-size="12">{lo:.3g}</text>'
            f'<text x="{L}" y="{H - 8}" font-size="12">0</text>'
            f'<text x="{W - R_ - 60}" y="{H - 8}" font-size="12">{_dur(span)}</text>'
            f'<text x="{L + 8}" y="26" font-size="13" font-weight="bold">{label}</text></svg>'
        )

    events: list[tuple[float, str, str]] = []
    for a in r.attempts:
        events.append((a.launched - r.start, f"attempt start ({a.run_dir})", "#f9a825"))
        for c in a.checkpoints:
            if "time" in c:
                events.append(
                    (float(c["time"]) - r.start, f"checkpoint step {c.get('step')}", "#1e88e5")
                )
        for h in a.hangs:
            events.append((float(h["time"]) - r.start, "hang named by the watchdog", "#6d4c41"))
    for it in r.interruptions:
        events.append(
            (
                float(it["time"]) - r.start,
                f"interrupted: {it['source']}, step {it['step']}",
                "#e53935",
            )
        )
    for s in r.spans:
        events.append((float(s["start"]) - r.start, f"{s.get('kind')} begins", "#8e24aa"))
    rate, loss = _series(r)
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
        if r.seconds[k] > 0
    )
    rows = "".join(
        f"<tr><td>{html.escape(time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(float(i['time']))))}"
        f"</td><td>{html.escape(str(i['source']))}</td><td>{i['step']}</td>"
        f"<td>{i['steps_lost']}</td></tr>"
        for i in r.interruptions
    )
    table = (
        "<table><tr><th>when (UTC)</th><th>source</th><th>step</th><th>steps lost</th></tr>"
        + rows
        + "</table>"
        if rows
        else "<p>no interruptions</p>"
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>"
        "body{font-family:sans-serif;margin:20px;color:#222}"
        "ul{list-style:none;padding:0;columns:3}li{margin:2px 0}"
        "li span{display:inline-block;width:12px;height:12px;margin-right:6px}"
        "td,th{padding:2px 10px;text-align:left}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>"
        f"<p><b>goodput {r.goodput:.1%}</b>: {_dur(r.seconds['productive'])} productive of "
        f"{_dur(r.wall_s)} wall over {len(r.attempts)} attempt(s)</p>"
        f'<h2>where the time went</h2><svg width="{W}" height="36" id="bar">{"".join(bar)}</svg>'
        f"<ul>{legend}</ul><h2>timeline</h2>"
        + chart(rate, "#2e7d32", "steps/s")
        + chart(loss, "#e53935", "loss")
        + f"<h2>interruptions</h2>{table}</body></html>"
    )
