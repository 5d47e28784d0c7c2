"""The goodput report of ``aios report``: the account of :mod:`aios.runrecord.goodput` as text
lines (:func:`render_text`) and as one self-contained HTML page (:func:`render_html`: where the
time went, the steps/s and loss series over the wall time, and the attempts, checkpoints,
interruptions, hangs and cloud spans on one timeline)."""

from __future__ import annotations

import html
import math
import time

from aios.runrecord.goodput import CATEGORIES, Report

__all__ = ["render_html", "render_text"]


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

#: the charts' geometry (px): width, height, and the left, right, top and bottom margins
W, H, L, R_, T, B = 960, 240, 100, 20, 12, 44

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


def _marks(r: Report) -> list[tuple[float, str, str]]:
    """The marks on the time axis: (run time, kind, tooltip)."""
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
    return marks


class _Page:
    """The charts of one report page, on the account's time axis (the wall time, idle time
    between separate runs left out), with the events marked on each."""

    def __init__(self, r: Report) -> None:
        self.r = r
        self.span = max(r.wall_s, 1e-9)
        self.ticks, self.unit = _time_ticks(self.span)
        self.marks = _marks(r)
        #: the restarts after interruptions: (from, to) in run time
        self.bands = [
            (_run_time(r, float(it["restart_from"])), _run_time(r, float(it["restart_to"])))
            for it in r.interruptions
            if float(it["restart_to"]) > float(it["restart_from"])
        ]

    def x(self, t: float) -> float:
        return L + (W - L - R_) * max(0.0, min(t, self.span)) / self.span

    def chart(
        self, name: str, ylabel: str, series: list[tuple[str, str, list[Line]]], pad_zero: bool
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
        for b0, b1 in self.bands:
            out.append(
                f'<rect x="{self.x(b0):.1f}" y="{T}" width="{max(self.x(b1) - self.x(b0), 1):.1f}" '
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
        out.append(self.axis(H - B))
        out.append(
            f'<text class="ylabel" transform="translate(14,{T + (H - T - B) / 2:.0f}) '
            f'rotate(-90)" font-size="12" text-anchor="middle">{html.escape(ylabel)}</text>'
        )
        for t, kind, tip in self.marks:
            color, dash, _ = _MARKS[kind]
            d = f' stroke-dasharray="{dash}"' if dash else ""
            xe = self.x(t)
            out.append(
                f'<line class="mark-{kind}" x1="{xe:.1f}" x2="{xe:.1f}" y1="{T}" y2="{H - B}" '
                f'stroke="{color}" stroke-width="{2 if kind == "run" else 1.5}"{d}>'
                f"<title>{html.escape(tip)}</title></line>"
            )
        for label, color, lines in series:
            for line in lines:
                if line:
                    pts = " ".join(f"{self.x(t):.1f},{y(v):.1f}" for t, v in line)
                    out.append(
                        f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{pts}">'
                        f"<title>{html.escape(label)}</title></polyline>"
                    )
        out.append("</svg>")
        items = [(label, _swatch(color)) for label, color, lines in series if any(lines)]
        return f"<h3>{html.escape(name)}</h3>{''.join(out)}{self.mark_legend(items, dashed=True)}"

    def mark_legend(self, items: list[tuple[str, str]], dashed: bool) -> str:
        """The legend of a chart: ``items`` (its lines), then every kind of mark drawn."""
        items = list(items)
        for kind in _MARKS:
            if any(k == kind for _, k, _ in self.marks):
                color, dash, text = _MARKS[kind]
                items.append((text, _swatch(color, dash if dashed else "")))
        if self.bands:
            items.append(("restart after an interruption", _swatch(_RESTART_FILL, band=True)))
        if self.r.spans and not dashed:
            items.append(("a cloud span's length", _swatch(_MARKS["span"][0], band=True)))
        lis = "".join(f'<li class="legend-item">{sw}{html.escape(t)}</li>' for t, sw in items)
        return f'<ul class="legend">{lis}</ul>'

    def axis(self, y_base: float) -> str:
        """The time axis under a plot whose bottom is ``y_base``: self.ticks and one title."""
        out = []
        for t in self.ticks:
            xt = self.x(t)
            out.append(
                f'<line x1="{xt:.1f}" x2="{xt:.1f}" y1="{y_base}" y2="{y_base + 4}" '
                f'stroke="#666"/><text x="{xt:.1f}" y="{y_base + 16}" font-size="11" '
                f'text-anchor="middle">{_clock(t, self.unit)}</text>'
            )
        out.append(
            f'<text class="xlabel" x="{L + (W - L - R_) / 2:.0f}" y="{y_base + 32}" '
            f'font-size="12" text-anchor="middle">run time ({self.unit})'
            + (", idle time between separate runs left out" if self.r.idle else "")
            + "</text>"
        )
        return "".join(out)

    def lanes(self) -> str:
        """One row per kind of event, so that events at the same moment stay apart."""
        rows = [k for k in _MARKS if any(kind == k for _, kind, _ in self.marks)]
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
                for b0, b1 in self.bands:
                    out.append(
                        f'<rect x="{self.x(b0):.1f}" y="{y0 + 2}" '
                        f'width="{max(self.x(b1) - self.x(b0), 1):.1f}" '
                        f'height="{row_h - 4}" fill="{_RESTART_FILL}"/>'
                    )
            if kind == "span":
                for sp in self.r.spans:
                    s0 = _run_time(self.r, float(sp["start"]))
                    s1 = _run_time(self.r, float(sp["end"]))
                    out.append(
                        f'<rect x="{self.x(s0):.1f}" y="{y0 + 6}" '
                        f'width="{max(self.x(s1) - self.x(s0), 1):.1f}" '
                        f'height="{row_h - 12}" fill="{color}" opacity="0.35"/>'
                    )
            for t, k, tip in self.marks:
                if k == kind:
                    out.append(
                        f'<line class="mark-{k}" x1="{self.x(t):.1f}" x2="{self.x(t):.1f}" '
                        f'y1="{y0 + 2}" '
                        f'y2="{y0 + row_h - 2}" stroke="{color}" stroke-width="2">'
                        f"<title>{html.escape(tip)}</title></line>"
                    )
        out.append(self.axis(h))
        out.append("</svg>")
        return "<h3>events</h3>" + "".join(out) + self.mark_legend([], dashed=False)


def render_html(r: Report, title: str = "aios run") -> str:
    """One self-contained page (inline SVG, no external assets, no script): where the time went,
    steps/s and each loss the script logs over time with the events marked on the same time
    axis (each chart with a legend for every line and mark), and what each interruption cost."""
    page = _Page(r)
    span = page.span
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
        + page.lanes()
        + page.chart("steps per second", "steps/s", [("steps/s", "#2e7d32", rate)], True)
        + page.chart("loss", "loss", loss_series, False)
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
