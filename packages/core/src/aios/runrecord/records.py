"""Run records: ``<logging.run_dir>/<run-id>/`` written by rank 0.

* ``config.json``: the resolved config, secrets redacted.
* ``metrics.jsonl``: one JSON object per ``runtime.log`` call (``{"step": .., "time": .., ...}``).
* ``diagnostics.json``: versions, backend, strategy, precision, devices, world size, per-step
  timing (count, mean, p50/p90/p99, min, max, plus the last steps), the backend's own metrics
  (``strategy.metrics()``), checkpoints written, preemption events, exit status, the command
  line (secrets redacted). Rewritten at each checkpoint and at the end of the run, atomically
  (temp file + rename).

A run record never stops training: when it cannot be written (disk full, ``logging.run_dir`` a
file or a path too long), one warning says so and the record is switched off; no temp file is
left behind. The constructor touches no file; :meth:`RunRecord.start` creates the directory.

The run id is ``AIOS_RUN_ID`` (``aios-run`` sets it for every worker) or a new
``YYYYmmdd-HHMMSS-<pid>``.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import platform
import sys
import time
import warnings
from typing import Any

from aios.config.redact import redact, redact_argv
from aios.launcher.contract import LAUNCH_TIME_ENV, RUN_ID_ENV


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


def run_id_from_env() -> str:
    rid = os.environ.get(RUN_ID_ENV)
    if rid:
        return rid
    te = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if te and te != "none" and len(te) < 64:
        return te
    return new_run_id()


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for dist in ("aios-core", "torch", "torch_xla", "torch-neuronx", "deepspeed", "numpy"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            pass
    return out


def launch_time(default: float) -> float:
    """Wall-clock time this attempt was launched: the launcher's ``AIOS_RUN_LAUNCH_TIME``, else
    this process's start (``/proc/self/stat``), else ``default``."""
    v = os.environ.get(LAUNCH_TIME_ENV)
    if v:
        with contextlib.suppress(ValueError):
            return float(v)
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        # the start in clock ticks since boot, turned into an age on the boot clock: the boot
        # time in /proc/stat is whole seconds and drifts from the wall clock (NTP), which put
        # an attempt's launch up to a second before the end of the one before it
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - max(0.0, age)
    except (OSError, ValueError, IndexError, AttributeError):
        return default


class StepTimer:
    """Per-step wall times from step-end timestamps: the runtime appends one float per step
    (cheap on the hot path); statistics are computed when the record is written. Keeps the last
    ``keep`` timestamps (bounded memory) plus the count and the first/last times."""

    def __init__(self, t0: float, keep: int = 5001) -> None:
        self.t0 = t0
        self.stamps: collections.deque[float] = collections.deque(maxlen=keep)
        self.append = self.stamps.append  # the hot-path call
        self.first: float | None = None
        self.dropped = 0

    @property
    def first_step_s(self) -> float | None:
        if self.first is None and self.stamps:
            self.first = self.stamps[0]
        return None if self.first is None else self.first - self.t0

    def summary(self, steps: int | None = None) -> dict[str, Any]:
        first = self.first_step_s
        st = list(self.stamps)
        if len(st) < 2:
            return {"count": 0, "first_step_s": first}
        d = sorted(b - a for a, b in zip(st, st[1:], strict=False))
        last_window = [round(b - a, 6) for a, b in zip(st[-201:], st[-200:], strict=False)]
        n = (steps - 1) if steps else len(d)
        total = st[-1] - st[0]  # over the kept window

        def q(p: float) -> float:
            return d[min(len(d) - 1, int(p * len(d)))]

        return {
            "count": n,
            "mean_s": total / len(d),
            "min_s": d[0],
            "max_s": d[-1],
            "p50_s": q(0.5),
            "p90_s": q(0.9),
            "p99_s": q(0.99),
            "first_step_s": first,
            "window": len(d),
            "recent_s": last_window,
        }


class RunRecord:
    """The run directory of one run (rank 0 writes; other ranks hold an inert record)."""

    def __init__(self, root: str, run_id: str, active: bool) -> None:
        self.run_id = run_id
        self.dir = os.path.join(root, run_id)
        self.active = active
        self.started = time.time()
        self.diag: dict[str, Any] = {
            "run_id": run_id,
            "started": self.started,
            "checkpoints": [],
            "preemptions": [],
            "events": [],
        }
        self._metrics_file: Any = None
        self._failed = False

    def start(self) -> None:
        """Create the run directory (rank 0)."""
        if not self.active:
            return
        try:
            os.makedirs(self.dir, exist_ok=True)
        except (OSError, ValueError) as exc:
            self._fail(exc)
            return
        # a restart of the same run (aios-run --max-restarts) keeps its predecessors' accounts
        with contextlib.suppress(OSError, ValueError):
            with open(os.path.join(self.dir, "diagnostics.json")) as f:
                prev = json.load(f)
            if isinstance(prev, dict) and prev.get("started") != self.started:
                kept = prev.pop("previous_attempts", [])
                keys = (
                    "attempt",
                    "checkpoints",
                    "preemptions",
                    "events",
                    "started",
                    "updated",
                    "finished",
                )
                kept.append(
                    {k: prev[k] for k in keys if k in prev} | {"status": prev.get("status")}
                )
                self.diag["previous_attempts"] = kept

    def _fail(self, exc: BaseException) -> None:
        """Warn once and stop writing the record; training goes on."""
        if not self._failed:
            self._failed = True
            warnings.warn(
                f"aios: cannot write the run record in '{self.dir}' ({type(exc).__name__}: {exc}); "
                "training continues without it (set logging.run_dir to a writable directory)",
                stacklevel=3,
            )
        self.active = False
        if self._metrics_file is not None:
            with contextlib.suppress(Exception):
                self._metrics_file.close()
            self._metrics_file = None

    def _write_json(self, name: str, data: Any) -> None:
        if not self.active:
            return
        path = os.path.join(self.dir, name)
        tmp = f"{path}.tmp-{os.getpid()}"
        try:
            text = json.dumps(redact(data), indent=1, sort_keys=True, default=str)
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        except (OSError, ValueError) as exc:
            with contextlib.suppress(OSError, ValueError):
                os.unlink(tmp)
            self._fail(exc)

    def write_config(self, config: Any) -> None:
        self._write_json(
            "config.json", config.redacted_dict() if hasattr(config, "redacted_dict") else config
        )

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        if not self.active:
            return
        try:
            if self._metrics_file is None:
                self._metrics_file = open(os.path.join(self.dir, "metrics.jsonl"), "a")
            self._metrics_file.write(
                json.dumps({"step": step, "time": time.time(), **metrics}, default=float) + "\n"
            )
            self._metrics_file.flush()
        except (OSError, ValueError) as exc:
            self._fail(exc)

    def event(self, kind: str, **data: Any) -> None:
        self.diag["events"].append({"kind": kind, "time": time.time(), **data})

    def write_diagnostics(self, **extra: Any) -> None:
        self.diag.update(extra)
        self.diag["updated"] = time.time()
        self.diag["argv"] = redact_argv(sys.argv)
        self._write_json("diagnostics.json", self.diag)

    def close(self) -> None:
        if self._metrics_file is not None:
            with contextlib.suppress(Exception):
                self._metrics_file.close()
            self._metrics_file = None
