"""Checkpoint I/O against the disk's own rate, and the costs of an interruption, in one run.

    python bench/bench_ckpt_io.py [--mb 256] [--dir DIR] [--repeat 3] [--skip-runs]

1. **Full format, one process.** The same bytes written raw (``write`` + ``fsync``) against
   ``CheckpointStore.save`` (torch.save through the hashing writer, fsync, marker, rename), and
   read raw from a cold cache (``posix_fadvise(DONTNEED)`` on the file: only this file leaves
   the cache; the same for both sides) against ``CheckpointStore.load`` (one hashing pass over
   the file, the digest checked, then torch.load mapping the cached pages) and a bare
   ``torch.load`` (which copies every tensor into fresh memory). The two writes of a repeat
   run in alternating order, each after ``sync()`` (neither waits for the other's writeback,
   and neither always goes first into the kernel's dirty-page throttling). ``load`` returns
   tensors backed by the page cache; ``touch_s`` is what their first access then costs (page
   mappings), reported beside it. Ratios are throughputs: ``disk_time / aios_time`` (goal
   >= 0.8x each).
2. **Sharded (dcp), one process.** The time a background save blocks training, per GB, and its
   total time.
3. **An interruption.** A tiny training run gets SIGTERM: the seconds from the notice to the
   committed emergency checkpoint (its run record); then the relaunch's time from launch to
   its first step (resume included) against a cold start of the same run (goal <= 1.2x).

Medians over ``--repeat`` (the full format's ratios also as the median of each repeat's own
ratio, "paired"). Prints one table; ``--json`` for tools.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time


def _drop(path: str) -> None:
    """Evict one file from the page cache (a cold read of it, nothing else touched)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _raw_write(path: str, data: bytes) -> float:
    t = time.perf_counter()
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - t


def _raw_read(path: str) -> float:
    _drop(path)
    t = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(8 << 20)
        while f.readinto(buf):
            pass
    return time.perf_counter() - t


def full_format(root: str, mb: int, repeat: int) -> dict[str, float]:
    import io

    import torch
    from aios.checkpoint import STATE_FILE, CheckpointStore

    n = mb * (1 << 20) // 4 // 8
    state = {f"w{i}": torch.randn(n) for i in range(8)}
    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    raw_w, save, raw_r, load, touch, tload = [], [], [], [], [], []
    for r in range(repeat):
        raw = os.path.join(root, f"raw-{r}.bin")
        store = CheckpointStore(os.path.join(root, f"ck-{r}"), keep=1)
        for side in (0, 1) if r % 2 == 0 else (1, 0):
            os.sync()
            if side == 0:
                raw_w.append(_raw_write(raw, data))
            else:
                t = time.perf_counter()
                store.save(1, state)
                save.append(time.perf_counter() - t)
        info = store.latest()
        path = f"{info.path}/{STATE_FILE}"
        raw_r.append(_raw_read(raw))
        _drop(path)
        t = time.perf_counter()
        loaded = store.load(info)
        load.append(time.perf_counter() - t)
        t = time.perf_counter()
        for v in loaded.values():
            v.view(torch.uint8)[::4096].sum()
        touch.append(time.perf_counter() - t)
        del loaded
        _drop(path)
        t = time.perf_counter()
        torch.load(path, map_location="cpu", weights_only=True)
        tload.append(time.perf_counter() - t)
        os.unlink(raw)
    m = statistics.median
    gb = len(data) / 1e9
    return {
        "bytes": len(data),
        "disk_write_s": m(raw_w),
        "save_s": m(save),
        "save_ratio": m(raw_w) / m(save),
        # the same ratio taken within each repeat (the two writes ran back to back), then the
        # median: steadier where other work on the disk swings its rate between repeats
        "save_ratio_paired": m([w / s for w, s in zip(raw_w, save, strict=True)]),
        "disk_read_s": m(raw_r),
        "load_s": m(load),
        "load_ratio": m(raw_r) / m(load),
        "load_ratio_paired": m([r / t for r, t in zip(raw_r, load, strict=True)]),
        "touch_s": m(touch),
        "torch_load_s": m(tload),
        "disk_write_GBps": gb / m(raw_w),
        "disk_read_GBps": gb / m(raw_r),
    }


def sharded(root: str, mb: int, repeat: int) -> dict[str, float]:
    import torch
    from aios.checkpoint.formats.dcp import DcpCheckpointer, rng_state

    width = int((mb * (1 << 20) / 4 / 4) ** 0.5)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, width))
    nbytes = sum(p.numel() * 4 for p in model.parameters())
    blocking, total = [], []
    for r in range(repeat):
        ck = DcpCheckpointer(os.path.join(root, f"dcp-{r}"), async_mode="thread")
        t = time.perf_counter()
        ck.save(1, [model], [], {"step": 1}, {"rng": rng_state()}, async_save=True)
        blocking.append(time.perf_counter() - t)
        ck.wait()
        total.append(time.perf_counter() - t)
    m = statistics.median
    return {
        "bytes": nbytes,
        "blocking_s": m(blocking),
        "blocking_s_per_GB": m(blocking) / (nbytes / 1e9),
        "total_s": m(total),
    }


_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import aios, torch
    rt = aios.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = rt.setup(model, opt)
    rt.resume()
    x = torch.randn(32, 256)
    while rt.global_step < int(os.environ["TOTAL"]):
        rt.backward(model(x).pow(2).mean())
        rt.step(opt)
        if rt.global_step == int(os.environ.get("TERM_AT", "0")):
            os.kill(os.getpid(), 15)
    rt.close()
    """
)


def _attempt(runs: str) -> dict:
    newest = max(os.listdir(runs), key=lambda d: os.path.getmtime(os.path.join(runs, d)))
    with open(os.path.join(runs, newest, "diagnostics.json")) as f:
        return json.load(f)


def interruption(root: str, repeat: int) -> dict[str, float]:
    script = os.path.join(root, "train.py")
    with open(script, "w") as f:
        f.write(_SCRIPT)
    notice, cold, warm = [], [], []
    for r in range(repeat):
        base = os.path.join(root, f"run-{r}")
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
        env.update(
            AIOS_LOGGING__RUN_DIR=os.path.join(base, "runs"),
            AIOS_LOGGING__TENSORBOARD="false",
            AIOS_CHECKPOINT__DIR=os.path.join(base, "ck"),
            OMP_NUM_THREADS="1",
        )
        # cold start (nothing to resume), stopped by SIGTERM at step 20
        p = subprocess.run(
            [sys.executable, script], env={**env, "TOTAL": "40", "TERM_AT": "20"},
            capture_output=True, text=True,
        )  # fmt: skip
        assert p.returncode == 75, p.stdout + p.stderr
        d = _attempt(env["AIOS_LOGGING__RUN_DIR"])
        notice.append(d["preemptions"][-1]["seconds_since_notice"])
        cold.append(d["attempt"]["first_step"] - d["attempt"]["launched"])
        time.sleep(0.2)
        p = subprocess.run(
            [sys.executable, script], env={**env, "TOTAL": "25"}, capture_output=True, text=True
        )
        assert p.returncode == 0, p.stdout + p.stderr
        d = _attempt(env["AIOS_LOGGING__RUN_DIR"])
        warm.append(d["attempt"]["first_step"] - d["attempt"]["launched"])
    m = statistics.median
    return {
        "notice_to_committed_s": m(notice),
        "cold_start_to_first_step_s": m(cold),
        "relaunch_to_first_step_s": m(warm),
        "relaunch_ratio": m(warm) / m(cold),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-runs", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="aios-bench-ckpt-") as root:
        out = {
            "full": full_format(root, args.mb, args.repeat),
            "dcp": sharded(root, args.mb, args.repeat),
        }
        if not args.skip_runs:
            out["interruption"] = interruption(root, args.repeat)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    f = out["full"]
    print(f"full format, {f['bytes'] / 1e6:.0f} MB, one process (median of {args.repeat}):")
    print(
        f"  save  {f['save_s']:.3f}s vs disk write {f['disk_write_s']:.3f}s "
        f"({f['disk_write_GBps']:.2f} GB/s): {f['save_ratio']:.2f}x "
        f"(paired {f['save_ratio_paired']:.2f}x)"
    )
    print(
        f"  load  {f['load_s']:.3f}s vs disk read {f['disk_read_s']:.3f}s "
        f"({f['disk_read_GBps']:.2f} GB/s): {f['load_ratio']:.2f}x "
        f"(paired {f['load_ratio_paired']:.2f}x)  "
        f"(first touch of the state {f['touch_s']:.3f}s; bare torch.load {f['torch_load_s']:.3f}s)"
    )
    d = out["dcp"]
    print(
        f"dcp, {d['bytes'] / 1e6:.0f} MB, one process: background save blocks "
        f"{d['blocking_s']:.3f}s ({d['blocking_s_per_GB']:.2f} s/GB), total {d['total_s']:.3f}s"
    )
    if "interruption" in out:
        i = out["interruption"]
        print(f"notice -> committed emergency checkpoint: {i['notice_to_committed_s']:.3f}s")
        print(
            f"launch -> first step: relaunch {i['relaunch_to_first_step_s']:.2f}s vs cold "
            f"{i['cold_start_to_first_step_s']:.2f}s: {i['relaunch_ratio']:.2f}x"
        )


if __name__ == "__main__":
    main()
