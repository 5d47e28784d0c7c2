"""Goodput: the account of a run's wall time over every attempt, ``aios report`` (text, JSON,
HTML) on a run stopped by SIGTERM and resumed, the page drawn by headless Chromium, and no
torch import in the command."""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
import zlib
from html import escape
from pathlib import Path

import pytest
from aios.runrecord import goodput, render
from aios.runrecord.goodput import Attempt, account
from aios.testing.zygote import python

SCRIPT = Path(__file__).parent / "scripts" / "goodput_train.py"
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "gpt.py"
AIOS = [sys.executable, "-c", "from aios.cli.main import main; main()"]


def _chromium() -> str:
    """Headless Chromium, to draw a report page as a user's browser does; a skip without it
    (a failure with CI=true: .ci/run installs it)."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe:
        return exe
    if os.environ.get("CI") == "true":
        pytest.fail(
            "CI=true and no chromium: the report page cannot be drawn (.ci/run installs it)"
        )
    pytest.skip(
        "chromium is not installed: the report page is not drawn (apt-get install chromium)"
    )


def _screenshot(page: Path, shot: Path, height: int = 1000) -> None:
    r = subprocess.run(
        [
            _chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--screenshot={shot}",
            f"--window-size=1000,{height}",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shot.exists(), r.stderr


def _attempt(**kw) -> Attempt:
    base = dict(
        run_dir="r",
        launched=0.0,
        first_step=None,
        last_step=None,
        end=0.0,
        start_step=0,
        last_step_index=0,
        status="finished",
    )
    base.update(kw)
    return Attempt(**base)


def test_the_account_adds_up_to_the_wall_and_names_each_cause():
    a1 = _attempt(
        launched=100.0,
        first_step=110.0,  # 10 s start-up
        last_step=200.0,  # steps 1..91: 90 s of steps
        end=205.0,
        last_step_index=91,
        checkpoints=[{"time": 150.0, "blocking_seconds": 2.0}],
        hangs=[{"time": 205.0, "idle_s": 5.0}],  # hung in the tail
        status="running",  # killed by its launcher after the hang: the record never closed
    )
    a2 = _attempt(
        launched=230.0,  # 25 s between attempts, 10 of them provisioning
        first_step=240.0,
        last_step=330.0,  # resumed at 61, to step 151: 30 of its 90 steps re-run
        end=331.0,
        start_step=61,
        last_step_index=151,
    )
    spans = [
        {"kind": "provisioning", "start": 215.0, "end": 225.0},
        {"kind": "capacity_wait", "start": 50.0, "end": 100.0},
    ]
    r = account([a1, a2], spans)
    s = r.seconds
    assert r.wall_s == pytest.approx(281.0)
    assert sum(s.values()) == pytest.approx(r.wall_s)
    assert s["capacity_wait"] == pytest.approx(50.0)
    assert s["provisioning"] == pytest.approx(10.0)
    assert s["between_attempts"] == pytest.approx(15.0)
    assert s["startup"] == pytest.approx(20.0)
    assert s["checkpoint"] == pytest.approx(2.0)
    assert s["hung"] == pytest.approx(5.0)
    assert s["rework"] == pytest.approx(90.0 * 30 / 89)
    assert s["productive"] == pytest.approx(88.0 + 90.0 - 90.0 * 30 / 89)
    assert s["shutdown"] == pytest.approx(1.0)
    d = r.to_dict()
    assert d["goodput"] * d["wall_s"] + sum(d["badput"].values()) == pytest.approx(d["wall_s"])
    (it,) = d["interruptions"]
    assert it["source"] == "hang (watchdog)" and it["steps_lost"] == 30


def _run(tmp: Path, **env: str) -> subprocess.Popen:
    e = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    e.update(
        AIOS_LOGGING__RUN_DIR=str(tmp / "runs"),
        AIOS_LOGGING__TENSORBOARD="false",
        AIOS_CHECKPOINT__DIR=str(tmp / "ckpt"),
        AIOS_CHECKPOINT__EVERY="20",
        OMP_NUM_THREADS="1",
        PROGRESS_FILE=str(tmp / "progress"),
        **env,
    )
    return subprocess.Popen(
        [*python(), str(SCRIPT)],
        env=e,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp,
    )


def _png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """A PNG's rows as RGB(A) bytes (8-bit, non-interlaced: what Chromium writes)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, w, h, bpp = 8, b"", 0, 0, 4
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and ctype in (2, 6)
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    rows, prev, stride = [], bytearray(w * bpp), w * bpp
    for y in range(h):
        f, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, bpp, rows


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")
def test_an_attempts_launch_time_is_its_process_start_on_the_wall_clock():
    """Without the launcher's AIOS_RUN_LAUNCH_TIME, an attempt's launch is its process start:
    on the wall clock within a clock tick, never before the process began (the boot time in
    /proc/stat is whole seconds and drifts from the wall clock: a launch read from it came up to
    a second early, before the end of the attempt it followed)."""
    code = "from aios.runrecord.records import launch_time; print(repr(launch_time(0.0)))"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    tick = 1.0 / os.sysconf("SC_CLK_TCK")
    for _ in range(3):
        before = time.time()
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
        )
        after = time.time()
        launched = float(out.stdout)
        assert before - tick - 0.002 <= launched <= after, (before, launched, after)


def test_report_on_a_run_stopped_by_sigterm_and_resumed(tmp_path):
    t_begin = time.time()
    p = _run(tmp_path, TOTAL_STEPS="80")
    end = time.time() + 240
    while time.time() < end:
        try:
            if int((tmp_path / "progress").read_text() or 0) >= 30:
                break
        except (FileNotFoundError, ValueError):
            pass
        assert p.poll() is None, p.stdout.read()
        time.sleep(0.02)
    p.send_signal(signal.SIGTERM)
    out1 = p.communicate(timeout=240)[0]
    assert p.returncode == 75, out1
    p2 = _run(tmp_path, TOTAL_STEPS="80")
    out2 = p2.communicate(timeout=240)[0]
    assert p2.returncode == 0, out2
    t_end = time.time()
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 2

    html = tmp_path / "report.html"
    e = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    rj = subprocess.run(
        [*AIOS, "report", str(tmp_path / "ckpt"), "--json", "--html", str(html)],
        capture_output=True,
        text=True,
        env=e,
        timeout=120,
    )
    assert rj.returncode == 0, rj.stdout + rj.stderr
    d = json.loads(rj.stdout)
    assert d["attempts"] == 2 and d["runs"] == [str(r) for r in runs]
    parts = d["goodput"] * d["wall_s"] + sum(d["badput"].values())
    assert abs(parts - d["wall_s"]) <= 0.01 * d["wall_s"]
    assert t_begin - 1 <= d["start"] and d["end"] <= t_end + 1
    assert d["wall_s"] >= 0.9 * (d["end"] - d["start"])
    assert 0 < d["goodput"] < 1
    assert d["badput"]["startup"] > 0 and d["badput"]["checkpoint"] > 0
    assert d["badput"]["between_attempts"] > 0
    (it,) = d["interruptions"]
    assert it["source"] == "sigterm" and it["steps_lost"] == 0  # the emergency save kept all
    assert d["badput"]["rework"] == 0

    # the same account from the run record, as text
    rt = subprocess.run(
        [*AIOS, "report", str(runs[-1])], capture_output=True, text=True, env=e, timeout=120
    )
    assert rt.returncode == 0, rt.stderr
    assert rt.stdout.startswith(f"goodput {d['goodput']:.1%}")
    assert "interrupted" in rt.stdout and "by sigterm at step" in rt.stdout

    page = html.read_text()
    assert (
        "<svg" in page
        and "http://" not in page
        and "https://" not in page
        and "<script" not in page
    )
    shot = tmp_path / "shot.png"
    _screenshot(html, shot)
    w, bpp, rows = _png_pixels(shot)

    def colored(y0: int, y1: int, x0: int = 60, x1: int = 960) -> int:
        n = 0
        for row in rows[y0:y1]:
            for x in range(x0, min(x1, w)):
                r_, g, b = row[x * bpp : x * bpp + 3]
                if max(r_, g, b) - min(r_, g, b) > 60:  # a saturated colour: bar or a line
                    n += 1
        return n

    # the bar of where the time went (green productive, ...) and the two charts' lines
    assert colored(60, 200) > 2000, "no time bar drawn"
    assert colored(250, 1000) > 300, "no timeline drawn"


def test_report_imports_no_torch_and_bad_input_is_one_line(tmp_path):
    code = (
        "import sys\nfrom aios.cli.main import main\n"
        f"sys.argv = ['aios', 'report', {str(tmp_path)!r}]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
        "assert 'torch' not in sys.modules, 'torch imported'\nsys.exit(code)\n"
    )
    e = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=120
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "torch imported" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_cloud_events_enter_the_account(tmp_path):
    rd = tmp_path / "run"
    goodput.write_event(str(rd), "capacity_wait", start=10.0, end=40.0, source="aws")
    goodput.write_event(str(rd), "interruption", source="aws-spot")
    lines = [json.loads(x) for x in (rd / "events.jsonl").read_text().splitlines()]
    assert lines[0] == {"kind": "capacity_wait", "start": 10.0, "end": 40.0, "source": "aws"}
    assert "time" in lines[1]
    r = account(
        [_attempt(launched=40.0, first_step=45.0, last_step=95.0, end=100.0, last_step_index=51)],
        lines,
    )
    assert r.seconds["capacity_wait"] == pytest.approx(30.0) and r.wall_s == pytest.approx(90.0)


def _report_json(target: Path, *extra: str) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    r = subprocess.run(
        [*AIOS, "report", str(target), "--json", *extra],
        capture_output=True,
        text=True,
        env=e,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def test_two_finished_runs_are_separate_runs_not_an_interruption(tmp_path):
    """A run that finished and a later run that resumes its checkpoint and trains on: no
    interruption, no rework, the idle time between them in no category and not in the wall
    time; the same account by run record and by checkpoint directory."""
    for total in ("20", "40"):
        p = _run(tmp_path, TOTAL_STEPS=total)
        out = p.communicate(timeout=240)[0]
        assert p.returncode == 0, out
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 2
    diags = [json.loads((r / "diagnostics.json").read_text()) for r in runs]
    assert [d["status"] for d in diags] == ["finished", "finished"]
    by_run = _report_json(runs[-1])
    by_ckpt = _report_json(tmp_path / "ckpt")
    assert by_run["interruptions"] == [], by_run["interruptions"]
    assert by_run == by_ckpt
    assert by_run["attempts"] == 2 and by_run["separate_runs"] == 2
    assert by_run["badput"]["rework"] == 0 and by_run["badput"]["between_attempts"] == 0
    # the wall time is the two runs' own time; what lies between them is reported apart
    spans = [d["finished"] - d["attempt"]["launched"] for d in diags]
    idle = diags[1]["attempt"]["launched"] - diags[0]["finished"]
    assert by_run["wall_s"] == pytest.approx(sum(spans), abs=0.01)
    assert by_run["idle_between_runs_s"] == pytest.approx(idle, abs=0.01)
    assert by_run["productive_s"] + sum(by_run["badput"].values()) == pytest.approx(
        by_run["wall_s"], abs=0.01
    )
    e = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    rt = subprocess.run(
        [*AIOS, "report", str(runs[-1])], capture_output=True, text=True, env=e, timeout=120
    )
    assert rt.returncode == 0, rt.stderr
    assert "interrupted" not in rt.stdout and "2 separate runs" in rt.stdout, rt.stdout


def _rgb(hex_color: str) -> tuple[int, int, int]:
    return tuple(int(hex_color[i : i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]


def test_the_examples_report_charts_its_loss_and_a_rerun_is_no_interruption(tmp_path):
    """examples/gpt.py run twice as its docstring prints (the second run resumes the finished
    checkpoint and has nothing left to train): one training, the same goodput by run record and
    by checkpoint directory, no interruption; the HTML page, drawn by headless Chromium, shows
    the loss the example logs (``train/loss``) as a curve in the chart, one time axis title per
    chart and a legend entry for every kind of mark drawn."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    e.update(AIOS_LOGGING__TENSORBOARD="false", GPT_SAMPLE="0", OMP_NUM_THREADS="1")
    small = ["--steps", "30", "--n-layer", "1", "--n-embd", "32", "--eval-every", "10"]
    small += ["--eval-batches", "2", "--block-size", "32", "--batch-size", "16"]
    for _ in range(2):
        r = subprocess.run(
            [
                *python("-c", "from aios.cli.run import main; main()"),
                "logging.every=2",
                str(EXAMPLE),
                *small,
            ],
            capture_output=True,
            text=True,
            env=e,
            cwd=tmp_path,
            timeout=400,
        )
        assert r.returncode == 0, r.stdout + r.stderr
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 2
    html = tmp_path / "report.html"
    by_ckpt = _report_json(tmp_path / "checkpoints" / "gpt", "--html", str(html))
    by_run = _report_json(runs[-1])
    assert by_run["goodput"] == by_ckpt["goodput"] and by_run["runs"] == by_ckpt["runs"]
    assert by_run["attempts"] == 2 and by_run["interruptions"] == []
    assert by_run["badput"]["between_attempts"] == 0

    page = html.read_text()
    assert "train/loss" in page and "no loss logged" not in page
    charts = page.split('<svg class="chart"')[1:]
    assert len(charts) == 3  # the events, steps/s and loss
    for c in charts:
        body, legend = c.split("</svg>", 1)[0], c.split('<ul class="legend">', 1)[1]
        assert body.count('class="xlabel"') == 1 and "run time (m:ss)" in body
        kinds = {k for k in render._MARKS if f'class="mark-{k}"' in body}
        assert {"attempt", "run", "checkpoint"} <= kinds
        for k in kinds:
            assert escape(render._MARKS[k][2]) in legend.split("</ul>", 1)[0], k

    shot = tmp_path / "shot.png"
    _screenshot(html, shot, height=1400)
    w, bpp, rows = _png_pixels(shot)
    want = _rgb(render._LOSS_COLORS[0])  # the first loss series: train/loss
    columns, pixels = set(), 0
    for row in rows:
        for x in range(110, min(w, 960)):  # the plot area (legend swatches lie left of it)
            if all(abs(row[x * bpp + i] - want[i]) <= 20 for i in range(3)):
                columns.add(x)
                pixels += 1
    # a line, however much of the wall time start-up took: some pixels over several columns
    assert pixels >= 30 and len(columns) >= 3, f"no loss curve drawn ({pixels} px)"


def test_interruptions_cost_and_separate_runs_in_the_account():
    """A killed attempt, its restart (an interruption: its cost is the work redone and the
    restart), then a separate run launched later after a provisioning span: the idle time before
    that span is in no category and not in the wall time."""
    a1 = _attempt(
        launched=0.0,
        first_step=10.0,
        last_step=100.0,
        end=100.0,
        last_step_index=91,
        status="running",
    )
    a2 = _attempt(
        launched=110.0,
        first_step=120.0,
        last_step=210.0,
        end=212.0,
        start_step=61,
        last_step_index=151,
    )
    a3 = _attempt(
        run_dir="r2",
        launched=1000.0,
        first_step=1005.0,
        last_step=1050.0,
        end=1051.0,
        start_step=151,
        last_step_index=200,
    )
    r = account([a1, a2, a3], [{"kind": "provisioning", "start": 990.0, "end": 1000.0}])
    assert r.idle == [(212.0, 990.0)] and r.separate_runs == 2 and r.run_starts == [2]
    assert r.wall_s == pytest.approx(1051.0 - 778.0)
    assert sum(r.seconds.values()) == pytest.approx(r.wall_s)
    assert r.seconds["provisioning"] == pytest.approx(10.0)
    assert r.seconds["between_attempts"] == pytest.approx(10.0)
    (it,) = r.interruptions
    rework = 90.0 * 30 / 89
    assert it["source"] == "unannounced (killed)" and it["steps_lost"] == 30
    assert it["work_lost_s"] == pytest.approx(rework, abs=1e-3)
    assert it["restart_s"] == pytest.approx(20.0)  # last step 100 -> next first step 120
    assert it["cost_s"] == pytest.approx(rework + 20.0, abs=1e-3)
    assert r.seconds["rework"] == pytest.approx(rework)
    # a script that exited without rt.close(): a separate run when relaunched in a new run
    # record, a restart (an interruption) when its launcher restarted it in the same record
    e1 = _attempt(launched=0.0, first_step=1.0, last_step=5.0, end=6.0, last_step_index=5)
    e1.status = "exited"
    e2 = _attempt(launched=8.0, first_step=9.0, last_step=12.0, end=13.0, start_step=5)
    assert account([e1, e2]).interruptions != []
    e3 = _attempt(run_dir="other", launched=8.0, first_step=9.0, end=13.0, start_step=5)
    assert account([e1, e3]).interruptions == [] and account([e1, e3]).wall_s == 11.0


def test_a_killed_attempt_reaches_as_far_as_its_logged_metrics(tmp_path):
    """The record of a killed attempt was last written at a checkpoint (step 20); the steps it
    logged after it (to 31) are the work the interruption lost."""
    run = tmp_path / "run"
    run.mkdir()
    diag = {
        "started": 100.0,
        "updated": 120.0,
        "status": "running",
        "attempt": {
            "launched": 100.0,
            "first_step": 105.0,
            "last_step": 120.0,
            "start_step": 0,
            "last_step_index": 20,
        },
        "checkpoints": [{"step": 20, "time": 120.0, "blocking_seconds": 0.1}],
    }
    (run / "diagnostics.json").write_text(json.dumps(diag))
    lines = [{"step": s, "time": 100.0 + s, "loss": 1.0 / s} for s in range(1, 32)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    (a,) = goodput.read_attempts(str(run))
    assert a.last_step_index == 31 and a.last_step == 131.0 and a.end == 131.0
