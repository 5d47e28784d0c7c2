"""Each rank's output relayed to aios-run's terminal one whole line at a time.

torch's elastic agent copies each rank's output file to the launcher's stdout/stderr with the
rank's prefix (``[rank1]:``), reading with ``readline``. A rank whose stream is unbuffered
(``PYTHONUNBUFFERED=1``, set by many container images and CI systems) writes ``print``'s text
and its newline in two writes; the copy then ends a prefixed piece without its newline, and the
next rank's line lands on the same terminal line (``[rank1]:init model 627[rank0]:init model
627``). Here a piece without its newline is held until the newline comes, or for ``hold``
seconds (a line drawn piece by piece without newlines still shows as it goes).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from threading import Event
from typing import TextIO

#: how long a line without its newline is held back before it is shown as it is (seconds)
HOLD_S = 1.0


def tail_whole_lines(
    header: str,
    file: str,
    dst: TextIO,
    finished: Event,
    interval_sec: float,
    log_line_filter: Callable[[str], bool] | None = None,
    *,
    hold: float = HOLD_S,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """What ``torch.distributed.elastic.multiprocessing.tail_log.tail_logfile`` does (same
    parameters), writing only whole lines while the rank runs."""
    while not os.path.exists(file):
        if finished.is_set():
            return
        time.sleep(interval_sec)

    def emit(text: str) -> None:
        if log_line_filter is None or log_line_filter(text):
            dst.write(f"{header}{text}")

    with open(file, errors="replace") as fp:
        part, since = "", 0.0
        while True:
            piece = fp.readline()
            if piece:
                if not part:
                    since = clock()
                part += piece
                if part.endswith("\n"):
                    emit(part)
                    part = ""
                continue
            if finished.is_set():  # the rank is done: what is left is all there will be
                if part:
                    emit(part if part.endswith("\n") else part + "\n")
                return
            if part and clock() - since >= hold:
                emit(part)
                part = ""
            time.sleep(interval_sec)


def install() -> None:
    """Make torch's elastic agent in this process relay whole lines (aios-run's in-process
    launch; torch 2.9 and later look ``tail_logfile`` up in its module when they start a
    tail)."""
    from torch.distributed.elastic.multiprocessing import tail_log

    tail_log.tail_logfile = tail_whole_lines
