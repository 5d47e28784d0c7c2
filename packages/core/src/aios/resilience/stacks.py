"""Every rank's Python stacks, read from outside, and what they say.

:func:`collect` makes each rank of a status folder (and the rank's child processes) dump its
threads' stacks (faulthandler on :data:`aios.resilience.workers.DUMP_SIGNAL`) and reads them;
:func:`summarize` turns the dumps into one line per rank (where it waits: a collective, an FSDP
gather, the data loader, the user's own line); :func:`full_text` is what the run record keeps.
Used by the watchdog (:mod:`aios.resilience.watchdog`) and by ``aios stacks``. Nothing here
imports torch.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

from aios.launcher import status as rank_status
from aios.resilience.workers import (
    DUMP_SIGNAL,
    Worker,
    alive,
    catches,
    descendants,
    process_state,
    read_workers,
)

# ------------------------------------------------------------------------------ collecting


@dataclass
class Dump:
    """What could be read of one rank."""

    rank: int
    pid: int
    node: int
    host: str
    steps: int
    state: str
    text: str = ""  # faulthandler's dump of the rank process ("" when none came)
    children: list[tuple[int, str, str]] = field(default_factory=list)  # (pid, state, dump)
    info: dict[str, Any] = field(default_factory=dict)


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read_from(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _await_dumps(paths: dict[int, tuple[str, int]], deadline: float) -> dict[int, str]:
    """Wait until each file grew and then stayed the same for a moment, or the deadline.
    ``paths``: key -> (file, size before the signal)."""
    done: dict[int, str] = {}
    last: dict[int, tuple[int, float]] = {}
    while len(done) < len(paths):
        now = time.monotonic()
        for key, (path, before) in paths.items():
            if key in done:
                continue
            size = _file_size(path)
            if size > before:
                prev = last.get(key)
                if prev and prev[0] == size and now - prev[1] >= 0.3:
                    done[key] = _read_from(path, before)
                elif not prev or prev[0] != size:
                    last[key] = (size, now)
        if now >= deadline:
            for key, (path, before) in paths.items():
                if key not in done and _file_size(path) > before:
                    done[key] = _read_from(path, before)  # what came, even if incomplete
            break
        time.sleep(0.05)
    return done


def collect(status_dir: str, wait: float = 10.0) -> list[Dump]:
    """Every registered rank's stacks (all threads), and those of its forked children (DataLoader
    workers). Bounded: a rank that does not answer within ``wait`` seconds is reported with its
    process state only. Dumps of one status folder are serialised (a lock file)."""
    import fcntl

    workers = read_workers(status_dir)
    with open(os.path.join(status_dir, "dump.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return _collect(status_dir, workers, wait)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _collect(status_dir: str, workers: dict[int, Worker], wait: float) -> list[Dump]:
    dumps: dict[int, Dump] = {}
    pending: dict[int, tuple[str, int]] = {}
    for rank, w in sorted(workers.items()):
        d = Dump(
            rank,
            w.pid,
            w.node,
            str(w.info.get("host", "")),
            w.steps,
            process_state(w.pid),
            info=w.info,
        )
        dumps[rank] = d
        if not alive(w.pid):
            continue
        sig = int(w.info.get("signal", DUMP_SIGNAL))
        path = rank_status.stacks_file(status_dir, rank)
        if catches(w.pid, sig):
            pending[rank] = (path, _file_size(path))
            with contextlib.suppress(OSError):
                os.kill(w.pid, sig)
    deadline = time.monotonic() + wait
    for rank, text in _await_dumps(pending, deadline).items():
        dumps[rank].text = text
    for rank, d in dumps.items():  # forked children (DataLoader workers): one at a time per file
        if not alive(d.pid):
            continue
        sig = int(d.info.get("signal", DUMP_SIGNAL))
        path = rank_status.stacks_file(status_dir, rank)
        for child in descendants(d.pid)[:16]:
            state = process_state(child)
            text = ""
            if catches(child, sig):
                before = _file_size(path)
                with contextlib.suppress(OSError):
                    os.kill(child, sig)
                end = min(deadline + 2.0, time.monotonic() + 2.0)
                text = _await_dumps({0: (path, before)}, end).get(0, "")
            d.children.append((child, state, text))
        d.state = process_state(d.pid) or d.state
    return [dumps[r] for r in sorted(dumps)]


# ------------------------------------------------------------------------------ summary

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')

#: torch.distributed functions that are collectives (c10d's Python entry points)
COLLECTIVES = frozenset(
    {
        "all_reduce",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "all_gather_coalesced",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "broadcast",
        "broadcast_object_list",
        "barrier",
        "monitored_barrier",
        "all_to_all",
        "all_to_all_single",
        "reduce",
        "gather",
        "gather_object",
        "scatter",
        "scatter_object_list",
        "send",
        "recv",
        "batch_isend_irecv",
    }
)


def _collective(fn: str) -> str:
    """``all_gather_single`` -> ``all_gather``; "" for anything that is not a collective."""
    if fn in COLLECTIVES:
        return fn
    base = fn.rsplit("_", 1)[0]
    return base if fn.endswith(("_single", "_coalesced", "_base")) and base in COLLECTIVES else ""


_FSDP_GATHER = ("unshard", "wait_for_unshard", "foreach_all_gather", "foreach_all_gather_copy_out")
_FSDP_REDUCE = ("foreach_reduce", "post_backward", "_root_post_backward_final_callback")
_LOADER = ("_try_get_data", "_get_data", "_next_data")

Frame = tuple[str, int, str]  # file, line, function


def parse_threads(text: str) -> list[tuple[int, list[Frame]]]:
    """faulthandler's text -> [(thread id, frames innermost first)] (the first block only: a
    forked child's dump follows in the same file)."""
    threads: list[tuple[int, list[Frame]]] = []
    frames: list[Frame] | None = None
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            frames = []
            threads.append((int(m.group(2), 16), frames))
            continue
        if line.startswith("Stack (most recent call first)"):
            frames = []
            threads.append((0, frames))
            continue
        f = _FRAME.match(line)
        if f and frames is not None:
            frames.append((f.group(1), int(f.group(2)), f.group(3)))
    return threads


@dataclass
class Where:
    """One rank's position: the user's innermost frame and what it waits in."""

    user: Frame | None
    wait: str = ""  # "all_gather (FSDP unshard)", "a DataLoader worker", ""
    collective: str = ""  # the collective's name when it waits in one

    def at(self) -> str:
        if self.user is None:
            return "?"
        return f"{os.path.basename(self.user[0])}:{self.user[1]} in {self.user[2]}"


def locate(frames: list[Frame], lib: list[str]) -> Where:
    """Where a thread is: its innermost frame outside the libraries, and the collective /
    DataLoader wait the libraries are in below it."""
    user = None
    below: list[Frame] = []
    for fr in frames:
        path = fr[0]
        if path.startswith("<") or any(path.startswith(d) for d in lib):
            below.append(fr)
            continue
        user = fr
        break
    coll = ctx = ""
    for path, _, fn in below:
        p = path.replace(os.sep, "/")
        if not coll and "torch/distributed/" in p:
            coll = _collective(fn)
        if not ctx and "torch/distributed/fsdp/" in p:
            if fn in _FSDP_GATHER:
                ctx = "FSDP unshard"
                coll = coll or "all_gather"
            elif fn in _FSDP_REDUCE:
                ctx = "FSDP gradient reduce-scatter"
                coll = coll or "reduce_scatter"
        if "torch/utils/data/" in p and fn in _LOADER:
            return Where(user, "a DataLoader worker")
        if not coll and not ctx and "torch/autograd/" in p and fn == "_engine_run_backward":
            # DDP's gradient all-reduce waits inside the autograd engine (no Python frame)
            return Where(user, "backward (the gradient all_reduce)", "backward")
    if coll:
        return Where(user, f"{coll} ({ctx})" if ctx else coll, coll)
    return Where(user)


def _main_frames(d: Dump, text: str | None = None) -> list[Frame]:
    """The frames of the main thread (a forked child's too: it keeps the parent's thread id)."""
    threads = parse_threads(d.text if text is None else text)
    main = d.info.get("main_thread")
    for ident, frames in threads:
        if ident == main:
            return frames
    for _, frames in threads:  # no id match: the thread running the script's <module>
        if frames and frames[-1][2] == "<module>":
            return frames
    return threads[0][1] if threads else []


def _ranks(rs: list[int]) -> str:
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))


def summarize(dumps: list[Dump]) -> list[str]:
    """A few lines: where each rank is, and which ranks are missing from the collective the
    others wait in."""
    lines: list[str] = []
    where: dict[int, Where] = {}
    world = max((int(d.info.get("world_size", 1)) for d in dumps), default=0)
    multi_node = world > len(dumps) or len({d.node for d in dumps}) > 1
    for d in dumps:
        tag = f"rank {d.rank}" + (f" (node {d.node}, {d.host})" if multi_node else "")
        tag += f" [pid {d.pid}, step {d.steps}]"
        if not d.text:
            st = d.state or "exited"
            lines.append(f"{tag}: no stack within the wait: stuck outside Python? state {st}")
            continue
        w = locate(_main_frames(d), list(d.info.get("lib", [])))
        where[d.rank] = w
        if w.wait == "a DataLoader worker":
            line = f"{tag}: waiting for a DataLoader worker from {w.at()}"
            for pid, state, text in d.children:
                cw = locate(_main_frames(d, text), list(d.info.get("lib", [])))
                line += f"; worker pid {pid}: " + (cw.at() if text else f"no stack, state {state}")
        elif w.wait:
            line = f"{tag}: waiting in {w.wait} from {w.at()}"
        else:
            line = f"{tag}: {w.at()}"
        if d.state.startswith(("D", "R")):
            line += f" (process {d.state})"
        lines.append(line)
    waiting = {r: w for r, w in where.items() if w.collective}
    if waiting:
        others = sorted(r for r in (d.rank for d in dumps) if r not in waiting)
        kinds = collections.defaultdict(list)
        for r, w in sorted(waiting.items()):
            kinds[(w.wait, w.at())].append(r)
        if others:
            (wait, _), rs = max(kinds.items(), key=lambda kv: len(kv[1]))
            lines.append(
                f"{_ranks(others)} {'is' if len(others) == 1 else 'are'} not in the {wait} that "
                f"{_ranks(rs)} {'waits' if len(rs) == 1 else 'wait'} in"
            )
        if len(kinds) > 1:
            parts = [f"{_ranks(rs)}: {wait} from {at}" for (wait, at), rs in kinds.items()]
            lines.append(
                "ranks wait in different collectives ("
                + "; ".join(parts)
                + "): a collective reached on some ranks only (e.g. under `if rank == 0`)"
            )
    seen = {d.rank for d in dumps}
    missing = [r for r in range(world) if r not in seen]
    if missing and len(missing) < world:
        lines.append(f"{_ranks(missing)}: on other nodes (their aios-run reports them)")
    return lines


def full_text(dumps: list[Dump], headline: str) -> str:
    out = [headline, ""]
    for d in dumps:
        out.append(
            f"=== rank {d.rank} (node {d.node}, host {d.host}, pid {d.pid}, step {d.steps}, "
            f"state {d.state or 'exited'}) ==="
        )
        out.append(d.text.rstrip() or "(no stack within the wait)")
        for pid, state, text in d.children:
            out.append(f"--- child process {pid} of rank {d.rank} (state {state or 'exited'}) ---")
            out.append(text.rstrip() or "(no stack: it does not handle the dump signal)")
        out.append("")
    return "\n".join(out)
