"""A DCP writer for tests/scripts/dcp_worker.py that holds or kills a rank's shard write.

Module level (importable by name) so that it pickles into DCP's checkpoint process, where an
``async_mode="process"`` background save runs it; the gate is a file, which both processes see.
"""

from __future__ import annotations

import os
import time
from typing import Any

from aios.checkpoint.formats import dcp as adcp


class GatedWriter(adcp._LocalWriter):  # type: ignore[misc, name-defined]
    """``overlap``: write only once ``<out>/gate-open-<rank>`` exists
    (``<out>/gate-timed-out-<rank>`` after 120 s); ``die``: rank 1 exits (code 9) inside the
    write of the save at ``die_at``; ``signals``: the writing process sends itself SIGTERM,
    SIGINT and SIGHUP, then writes."""

    def configure(self, job: dict[str, Any], rank: int, step: int) -> GatedWriter:
        self.job, self.rank, self.step = job, rank, step
        return self

    def write_data(self, plan: Any, planner: Any) -> Any:
        job, out = self.job, self.job["out"]
        if job["gate"] == "die" and self.rank == 1 and self.step == job.get("die_at"):
            open(os.path.join(out, "dying"), "w").close()
            os._exit(9)
        if job["gate"] == "signals":
            # what a preemption does to the whole process group of a rank: the checkpoint
            # process must finish this write (it ignores them; the rank handles its own)
            with open(os.path.join(out, f"writer-pid-{self.rank}"), "w") as f:
                f.write(str(os.getpid()))
            with open(os.path.join(out, f"writer-sched-{self.rank}"), "w") as f:
                f.write(str(os.sched_getscheduler(0)))  # this thread's scheduling policy
            import signal

            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                os.kill(os.getpid(), sig)
            time.sleep(0.2)
        if job["gate"] == "overlap":
            with open(os.path.join(out, f"writer-pid-{self.rank}"), "w") as f:
                f.write(str(os.getpid()))
            end = time.monotonic() + 120
            while not os.path.exists(os.path.join(out, f"gate-open-{self.rank}")):
                if time.monotonic() > end:
                    open(os.path.join(out, f"gate-timed-out-{self.rank}"), "w").close()
                    break
                time.sleep(0.01)
        return super().write_data(plan, planner)
