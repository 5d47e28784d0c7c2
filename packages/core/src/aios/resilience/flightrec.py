"""NCCL's Flight Recorder, read by the hang watchdog (no torch imported here).

torch's ``ProcessGroupNCCL`` keeps a ring buffer of its last collectives when
``TORCH_FR_BUFFER_SIZE`` (the older, deprecated name: ``TORCH_NCCL_TRACE_BUFFER_SIZE``) is above
0. With ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE=<stem>`` each rank creates the named pipe
``<stem><global rank>.pipe``; anything written to it makes the rank's NCCL monitor thread (C++,
no GIL, no Python) dump the buffer, pickled, to ``<TORCH_FR_DUMP_TEMP_FILE><global rank>`` (the
older name: ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``). ``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` makes a rank
dump there by itself when one of its collectives times out. Sources:
https://docs.pytorch.org/docs/stable/torch_nccl_environment_variables.html and
https://docs.pytorch.org/tutorials/unstable/flight_recorder_tutorial.html (torch's own
``DumpPipe`` and ``DebugInfoWriter`` in ``ProcessGroupNCCL``).

:func:`worker_env` gives ``aios-run``'s workers those settings (a variable the user set wins),
with the pipes and dumps in the launch's status folder; :func:`trigger_and_collect` is what the
watchdog calls on a hang: write to every rank's pipe, wait (bounded) for the dumps, read them
with an unpickler that builds nothing but plain containers, and say which rank is at which
collective, and which ranks never reached the collective the others wait in. Only NCCL process
groups record: on gloo, XLA or Neuron there is no pipe and nothing to say.
"""

from __future__ import annotations

import io
import os
import pickle
import stat
import time
from dataclasses import dataclass
from typing import Any

PIPE_STEM = "nccl-fr-pipe-"
DUMP_STEM = "nccl-fr-rank-"
BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
DUMP_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
PIPE_VAR = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
#: entries kept by each rank's recorder when the user did not choose (torch's own default size)
DEFAULT_BUFFER = "2000"


def worker_env(status_dir: str, env: dict[str, str]) -> dict[str, str]:
    """The Flight Recorder settings for the workers of one ``aios-run`` (only those the user's
    environment ``env`` does not set already)."""
    out: dict[str, str] = {}
    if not any(env.get(v) for v in BUFFER_VARS):
        out["TORCH_FR_BUFFER_SIZE"] = DEFAULT_BUFFER
    if not env.get(PIPE_VAR):
        out[PIPE_VAR] = os.path.join(status_dir, PIPE_STEM)
    if not any(env.get(v) for v in DUMP_VARS):
        out["TORCH_FR_DUMP_TEMP_FILE"] = os.path.join(status_dir, DUMP_STEM)
    if "TORCH_NCCL_DUMP_ON_TIMEOUT" not in env:
        out["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "1"
    return out


def _stems(env: dict[str, str]) -> tuple[str, str]:
    dump = next((env[v] for v in DUMP_VARS if env.get(v)), "/tmp/nccl_trace_rank_")
    return env.get(PIPE_VAR, ""), dump


class _PlainUnpickler(pickle.Unpickler):
    """A dump is data (dicts, lists, tuples, strings, numbers): no class is ever built."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a flight recorder dump names {module}.{name}")


def load_dump(data: bytes) -> dict[str, Any]:
    obj = _PlainUnpickler(io.BytesIO(data)).load()
    if not isinstance(obj, dict):
        raise pickle.UnpicklingError("a flight recorder dump is not a dict")
    return obj


@dataclass
class Record:
    """What one rank's recorder says: its last collective (per process group, the newest)."""

    rank: int
    path: str
    entries: int
    seq: int | None = None  # the newest collective's sequence number in the default group
    name: str = ""  # e.g. nccl:all_gather_into_tensor_coalesced
    state: str = ""  # scheduled, started, completed
    error: str = ""


def _summarise(rank: int, path: str, doc: dict[str, Any]) -> Record:
    entries = [e for e in doc.get("entries") or [] if isinstance(e, dict)]
    rec = Record(rank, path, len(entries))
    colls = [e for e in entries if not e.get("is_p2p") and e.get("collective_seq_id") is not None]
    if colls:
        # one line per rank: the group with the most collectives (the default group, usually)
        by_pg: dict[Any, list[dict[str, Any]]] = {}
        for e in colls:
            by_pg.setdefault(e.get("pg_id"), []).append(e)
        pg = max(by_pg.values(), key=len)
        last = max(pg, key=lambda e: int(e.get("collective_seq_id") or 0))
        rec.seq = int(last.get("collective_seq_id") or 0)
        rec.name = str(last.get("profiling_name") or "?")
        rec.state = str(last.get("state") or "?")
    return rec


def trigger_and_collect(
    ranks: dict[int, dict[str, str]], wait: float, clock: Any = time.monotonic
) -> list[Record]:
    """Ask every rank in ``ranks`` (global rank -> the environment it runs with) whose pipe
    exists for a dump, and read what comes within ``wait`` seconds (a dump file that is new or
    changed, then the same size for a moment)."""
    asked: dict[int, tuple[str, int]] = {}
    for rank, env in ranks.items():
        pipe_stem, dump_stem = _stems(env)
        if not pipe_stem:
            continue
        pipe = f"{pipe_stem}{rank}.pipe"
        try:
            if not stat.S_ISFIFO(os.stat(pipe).st_mode):
                continue
        except OSError:  # no pipe: not an NCCL process group, or no recorder
            continue
        try:
            before = os.stat(f"{dump_stem}{rank}").st_mtime_ns
        except OSError:
            before = -1
        try:
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: nobody reads it (the process group is gone, or not NCCL)
            continue
        try:
            os.write(fd, b"1\n")
        except OSError:
            continue
        finally:
            os.close(fd)
        asked[rank] = (f"{dump_stem}{rank}", before)
    out: dict[int, Record] = {}
    deadline = clock() + wait
    seen: dict[int, tuple[int, float]] = {}
    while asked and len(out) < len(asked):
        now = clock()
        for rank, (path, before) in asked.items():
            if rank in out:
                continue
            try:
                st = os.stat(path)
            except OSError:
                continue
            if st.st_mtime_ns == before:
                continue
            prev = seen.get(rank)
            if prev and prev[0] == st.st_size and now - prev[1] >= 0.3:
                out[rank] = _read(rank, path)
            elif not prev or prev[0] != st.st_size:
                seen[rank] = (st.st_size, now)
        if now >= deadline:
            break
        time.sleep(0.05)
    for rank, (path, _before) in asked.items():
        if rank not in out:
            out[rank] = Record(rank, path, 0, error=f"no dump within {wait:g}s")
    return [out[r] for r in sorted(out)]


def _read(rank: int, path: str) -> Record:
    try:
        with open(path, "rb") as f:
            doc = load_dump(f.read(64 << 20))
    except (OSError, pickle.UnpicklingError, EOFError, ValueError) as exc:
        return Record(rank, path, 0, error=f"unreadable dump: {exc}")
    return _summarise(rank, path, doc)


def summarize(records: list[Record]) -> list[str]:
    """Lines for the watchdog's summary: where each rank's NCCL collectives stand, and the ranks
    that never reached the newest collective some rank waits in."""
    if not records:
        return []
    parts = []
    for r in records:
        if r.error:
            parts.append(f"rank {r.rank}: {r.error}")
        elif r.seq is None:
            parts.append(f"rank {r.rank}: no collective recorded")
        else:
            parts.append(f"rank {r.rank} at collective #{r.seq} {r.name} ({r.state})")
    lines = ["NCCL flight recorder: " + "; ".join(parts)]
    known = [r for r in records if r.seq is not None and not r.error]
    if known:
        top = max(r.seq or 0 for r in known)
        waiting = [r for r in known if r.seq == top and r.state != "completed"]
        behind = [r.rank for r in known if (r.seq or 0) < top]
        if waiting and behind:
            names = ", ".join(str(x) for x in behind)
            lines.append(
                f"NCCL flight recorder: rank{'s' if len(behind) > 1 else ''} {names} never "
                f"reached collective #{top} ({waiting[0].name}) that rank "
                f"{', '.join(str(r.rank) for r in waiting)} wait{'s' if len(waiting) == 1 else ''} in"
            )
    return lines


def save(records: list[Record], into: str) -> list[str]:
    """Copy the dumps into the folder ``into`` of the run record, named as torch names them
    (``nccl_trace_rank_<rank>``: ``torchfrtrace <folder>`` reads them); returns the copies."""
    import shutil

    saved = []
    for r in records:
        if r.error or not os.path.exists(r.path):
            continue
        dest = os.path.join(into, f"nccl_trace_rank_{r.rank}")
        try:
            os.makedirs(into, exist_ok=True)
            shutil.copyfile(r.path, dest)
        except OSError:
            continue
        saved.append(dest)
    return saved


def keep_dumps(status_dir: str, into: str) -> str | None:
    """The dumps ranks wrote by themselves into the status folder (``TORCH_NCCL_DUMP_ON_TIMEOUT``:
    a collective timed out), copied into ``into`` under torch's names before the folder goes;
    returns ``into`` when there were any."""
    import shutil

    try:
        names = [n for n in os.listdir(status_dir) if n.startswith(DUMP_STEM)]
    except OSError:
        return None
    kept = 0
    for name in names:
        rank = name[len(DUMP_STEM) :]
        if not rank.isdigit():
            continue
        try:
            os.makedirs(into, exist_ok=True)
            shutil.copyfile(
                os.path.join(status_dir, name), os.path.join(into, f"nccl_trace_rank_{rank}")
            )
        except OSError:
            continue
        kept += 1
    return into if kept else None
