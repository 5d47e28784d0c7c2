"""A nanoGPT-style train.py: module-level setup, master_process evaluation, per-rank seed."""

import os
import time
from contextlib import nullcontext

import numpy as np
import torch
from model import GPT, GPTConfig  # the user's own module (never imported by aios check)
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: N817

out_dir = "out"
eval_interval = 200
eval_iters = 20
batch_size = 12
block_size = 64
max_iters = 1000
backend = "nccl"
device = "cuda"
dtype = "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float16"

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend=backend)
    ddp_rank = int(os.environ["RANK"])
    ddp_local_rank = int(os.environ["LOCAL_RANK"])
    device = f"cuda:{ddp_local_rank}"
    torch.cuda.set_device(device)
    master_process = ddp_rank == 0
    seed_offset = ddp_rank
else:
    master_process = True
    seed_offset = 0

torch.manual_seed(1337 + seed_offset)
torch.backends.cuda.matmul.allow_tf32 = True
device_type = "cuda" if "cuda" in device else "cpu"
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
ctx = (
    nullcontext()
    if device_type == "cpu"
    else torch.amp.autocast(device_type=device_type, dtype=ptdtype)
)

data = np.memmap("train.bin", dtype=np.uint16, mode="r")


def get_batch():
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i : i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack(
        [torch.from_numpy(data[i + 1 : i + 1 + block_size].astype(np.int64)) for i in ix]
    )
    x, y = (
        x.pin_memory().to(device, non_blocking=True),
        y.pin_memory().to(device, non_blocking=True),
    )
    return x, y


model = GPT(GPTConfig())
model.to(device)
scaler = torch.cuda.amp.GradScaler(enabled=(dtype == "float16"))
optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), device_type)
model = torch.compile(model)
if ddp:
    model = DDP(model, device_ids=[ddp_local_rank])
raw_model = model.module if ddp else model


@torch.no_grad()
def estimate_loss():
    model.eval()
    losses = torch.zeros(eval_iters)
    for k in range(eval_iters):
        X, Y = get_batch()
        with ctx:
            logits, loss = model(X, Y)
        losses[k] = loss.item()
    model.train()
    return losses.mean()


X, Y = get_batch()
t0 = time.time()
for iter_num in range(max_iters):
    if iter_num % eval_interval == 0 and master_process:
        val = estimate_loss()
        print(f"step {iter_num}: val loss {val:.4f}")
        checkpoint = {"model": raw_model.state_dict(), "iter_num": iter_num}
        torch.save(checkpoint, os.path.join(out_dir, "ckpt.pt"))
    with ctx:
        logits, loss = model(X, Y)
    X, Y = get_batch()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)

if ddp:
    destroy_process_group()
