"""A tiny training loop that hangs on purpose, for the watchdog tests (run under aios-run).

    hang_train.py MODE[,MODE...] [PID_DIR]

One MODE per rank (the last one for the ranks beyond it):

* ``fsdp_eval``: rank 0 evaluates alone under strategy=fsdp (its forward waits for an
  all-gather its peers never join);
* ``fsdp_eval0``: the same before the first step (nanoGPT evaluates at iteration 0 on the
  master rank); every rank marks itself before it;
* ``sleep``: sleeps in time.sleep; ``native``: blocks in a C call that holds the GIL;
* ``loader``: its DataLoader worker deadlocks on batch 3;
* ``live``: steps until the file PID_DIR/stop exists (all ranks agree); with SLOW_FIRST set,
  rank 0's first step computes for that many seconds (busy, as a compile).

Each rank writes its pid to PID_DIR/rank<N>-<pid> after its second step (DataLoader workers to
PID_DIR/loader<pid>) and prints ``steps started``.
"""

import os
import sys
import threading
import time

import aios
import torch

modes = sys.argv[1].split(",")
pid_dir = sys.argv[2] if len(sys.argv) > 2 else "."
rt = aios.init(seed=0)
rank = rt.rank
mode = modes[min(rank, len(modes) - 1)]


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        if mode == "loader" and i >= 6 * rt.world_size:  # batch 3 (sharded with a stride)
            with open(os.path.join(pid_dir, f"loader{os.getpid()}"), "w") as f:
                f.write(str(os.getpid()))
            threading.Event().wait()  # the deadlocked worker
        return torch.randn(8), torch.randn(1)


def mark() -> None:
    name = os.path.join(pid_dir, f"rank{rank}-{os.getpid()}")
    with open(name + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(name + ".tmp", name)


def evaluate(model):
    with torch.no_grad():
        return model(torch.randn(4, 8)).sum()


def block_in_c():
    import ctypes

    libc = ctypes.PyDLL(None)  # PyDLL: the GIL stays held during the call
    while True:
        libc.sleep(1000)


def fake_nccl_flight_recorder(seq: int, state: str) -> None:
    """What torch's ProcessGroupNCCL does with its flight recorder (there is no NCCL here), over
    the same seam: with TORCH_NCCL_DEBUG_INFO_PIPE_FILE set and a trace buffer above 0 it makes
    the named pipe <stem><rank>.pipe (unlinked first), opens it O_RDONLY|O_NONBLOCK, and on
    anything written to it dumps the pickled trace to <TORCH_NCCL_DEBUG_INFO_TEMP_FILE><rank>
    (torch's DumpPipe and DebugInfoWriter; its monitor thread polls once a second)."""
    import pickle

    stem = os.environ.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "")
    size = int(
        os.environ.get("TORCH_FR_BUFFER_SIZE")
        or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE")
        or 0
    )
    if not stem or size <= 0:
        return
    pipe = f"{stem}{rank}.pipe"
    try:
        os.unlink(pipe)
    except FileNotFoundError:
        pass
    os.mkfifo(pipe, 0o666)
    fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    out = (
        os.environ.get("TORCH_FR_DUMP_TEMP_FILE") or os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]
    ) + str(rank)
    entries = [
        {
            "record_id": i,
            "pg_id": 0,
            "process_group": ["0", "default_pg"],
            "collective_seq_id": i + 1,
            "p2p_seq_id": 0,
            "op_id": i + 1,
            "profiling_name": "nccl:all_reduce" if i + 1 < seq else "nccl:_allgather_base",
            "time_created_ns": time.time_ns(),
            "input_sizes": [[8, 8]],
            "output_sizes": [[8, 8]],
            "state": "completed" if i + 1 < seq else state,
            "is_p2p": False,
            "retired": i + 1 < seq,
            "timeout_ms": 600000,
            "frames": [],
        }
        for i in range(seq)
    ]

    def monitor():
        while True:
            time.sleep(1.0)
            try:
                got = os.read(fd, 128)
            except BlockingIOError:
                continue
            if got:
                with open(out + ".tmp", "wb") as f:
                    pickle.dump({"version": "2.10", "pg_config": {}, "entries": entries}, f)
                os.replace(out + ".tmp", out)

    threading.Thread(target=monitor, daemon=True).start()


if os.environ.get("FAKE_NCCL_FR"):  # per rank SEQ:STATE, e.g. 7:scheduled,6:completed
    _seq, _state = os.environ["FAKE_NCCL_FR"].split(",")[rank].split(":")
    fake_nccl_flight_recorder(int(_seq), _state)

model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
workers = 1 if mode == "loader" else 0  # the worker is forked (the Linux default)
loader = torch.utils.data.DataLoader(Data(), batch_size=2, num_workers=workers)
model, opt, loader = rt.setup(model, opt, loader)
if mode == "fsdp_eval0":
    mark()
    print(f"rank {rank}: before the first step", flush=True)
    if rank == 0:
        for _ in range(20):  # nanoGPT's estimate_loss: eval_iters forwards, on rank 0 only
            evaluate(model)  # waits in an all-gather rank 1 never joins
for i, (x, y) in enumerate(loader):
    if mode == "live" and i == 0 and rank == 0:
        # a compile: busy for that long (a sleeping rank would be idle, which is a hang)
        busy_until = time.monotonic() + float(os.environ.get("SLOW_FIRST", "0"))
        while time.monotonic() < busy_until:
            pass
    loss = torch.nn.functional.mse_loss(model(x), y)
    rt.backward(loss)
    rt.step(opt)
    if i == 1:
        mark()
        print(f"rank {rank}: steps started", flush=True)
    if mode == "fsdp_eval" and i == 2 and rank == 0:
        evaluate(model)
    if mode == "sleep" and i == 2:
        time.sleep(10_000)
    if mode == "native" and i == 2:
        block_in_c()
    if mode == "live":
        if rt.all_reduce(float(os.path.exists(os.path.join(pid_dir, "stop"))), "max").item():
            break
        time.sleep(0.02)
rt.print(f"finished at step {rt.global_step}")
