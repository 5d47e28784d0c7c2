"""A small GPT-style character model on the corpus shipped in examples/data (no downloads).

Each command trains on its own (its own ``checkpoint.dir``); run them in any order:

    aios-run examples/gpt.py                      # CPU: about 45 s on 2 idle cores
    aios-run --nprocs 2 checkpoint.dir=checkpoints/gpt-2p examples/gpt.py   # 2 processes, gloo
    aios-run --backend cuda checkpoint.dir=checkpoints/gpt-cuda examples/gpt.py   # GPUs
    aios-run --backend xla checkpoint.dir=checkpoints/gpt-xla examples/gpt.py     # TPU (PJRT)
    aios-run checkpoint.dir=gs://bucket/gpt examples/gpt.py   # checkpoints anywhere fsspec reaches

(bf16 on GPUs: ``--precision bf16-mixed``; Trainium: ``--backend neuron``.) ``GPT_STEPS=N``
in the environment (or ``--steps N`` after the script) sets the optimizer steps, 1000 by default:
``GPT_STEPS=50 aios-run examples/gpt.py`` is a quick look.

Written once for every backend: fixed shapes (``drop_last``, fixed context length), no
CUDA-only ops (plain masked attention), data order from a CPU ``torch.Generator``, metrics read
back only every few steps (one device sync on XLA). Periodic checkpoints go to
``checkpoints/gpt`` by default; relaunching the same command resumes from the newest complete
one (pass ``checkpoint.resume=false`` to start over); a run resumed at its last step says
there is nothing left to train. Prints the unigram baseline and the validation loss, and a final
summary (steps/s, tokens/s, loss).
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import aios
import torch
import torch.nn as nn
import torch.nn.functional as F

DATA = Path(__file__).parent / "data" / "corpus.txt"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data", default=str(DATA), help="text file to train on")
    p.add_argument(
        "--steps",
        type=int,
        default=os.environ.get("GPT_STEPS") or 1000,  # argparse checks a string default
        help="optimizer steps (default: $GPT_STEPS, else 1000)",
    )
    p.add_argument(
        "--batch-size", type=int, default=32, help="sequences per process per micro-step"
    )
    p.add_argument("--block-size", type=int, default=64, help="context length (characters)")
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=64)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-batches", type=int, default=8)
    return p.parse_args()


# ------------------------------------------------------------------------------ data


class CharWindows(torch.utils.data.Dataset):
    """Fixed-length windows (input, next-character target) over an encoded text."""

    def __init__(self, data: torch.Tensor, block: int, stride: int) -> None:
        self.data, self.block = data, block
        self.starts = range(0, len(data) - block - 1, stride)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.starts[i]
        chunk = self.data[s : s + self.block + 1]
        return chunk[:-1], chunk[1:]


def unigram_loss(train: torch.Tensor, val: torch.Tensor, vocab: int) -> float:
    """Cross-entropy (nats/char) of the validation text under the training text's character
    frequencies (add-one smoothed): the loss of a model that ignores context."""
    counts = torch.bincount(train, minlength=vocab).double() + 1
    logp = (counts / counts.sum()).log()
    return float(-logp[val].mean())


# ------------------------------------------------------------------------------ model


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, block: int, dropout: float) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd)
        )
        self.drop = nn.Dropout(dropout)
        self.register_buffer(
            "mask", torch.tril(torch.ones(block, block, dtype=torch.bool)), persistent=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape  # noqa: N806 (batch, time, channels: the usual GPT letters)
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(~self.mask[:T, :T], float("-inf")).softmax(dim=-1)
        y = (self.drop(att) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.mlp(self.ln2(x)))


class GPT(nn.Module):
    def __init__(
        self, vocab: int, block: int, n_layer: int, n_head: int, n_embd: int, dropout: float
    ) -> None:
        super().__init__()
        self.block = block
        self.tok = nn.Embedding(vocab, n_embd)
        self.pos = nn.Embedding(block, n_embd)
        self.blocks = nn.Sequential(
            *[Block(n_embd, n_head, block, dropout) for _ in range(n_layer)]
        )
        self.ln = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab, bias=False)
        self.head.weight = self.tok.weight  # weight tying
        self.register_buffer("positions", torch.arange(block), persistent=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        # GPT-2 initialisation: with PyTorch's N(0, 1) embedding default the tied output layer
        # starts with logits far too large (initial loss ~20 instead of ~ln(vocab)).
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(self.positions[: idx.size(1)])
        return self.head(self.ln(self.blocks(x)))

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
        for _ in range(n):
            logits = self(idx[:, -self.block :])[:, -1].float().cpu()
            nxt = torch.multinomial(logits.softmax(-1), 1, generator=generator).to(idx.device)
            idx = torch.cat([idx, nxt], dim=1)
        return idx


def tp_plan(model: nn.Module, mesh: object) -> dict[str, object]:
    """Tensor-parallel plan for ``mesh.tp > 1`` (``mesh.tp_plan=__main__:tp_plan``): each
    block's MLP split column-wise then row-wise (one all-reduce per block)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"blocks.*.mlp.0": ColwiseParallel(), "blocks.*.mlp.2": RowwiseParallel()}


# ------------------------------------------------------------------------------ training


def main() -> None:
    args = parse_args()
    rt = aios.init(defaults={"seed": 1337, "checkpoint": {"dir": "checkpoints/gpt", "every": 200}})

    text = Path(args.data).read_text(encoding="utf-8")
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    n = int(0.9 * len(data))
    train, val = data[:n], data[n:]
    baseline = unigram_loss(train, val, len(chars))

    train_loader = torch.utils.data.DataLoader(
        CharWindows(train, args.block_size, stride=args.block_size // 2),
        batch_size=args.batch_size,
        shuffle=True,
        drop_last=True,
    )
    val_loader = torch.utils.data.DataLoader(
        CharWindows(val, args.block_size, stride=args.block_size),
        batch_size=args.batch_size,
        shuffle=False,
        drop_last=True,
    )
    model = GPT(len(chars), args.block_size, args.n_layer, args.n_head, args.n_embd, args.dropout)
    decay = [p for n_, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n_, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
    )

    def lr_at(step: int) -> float:  # linear warmup, cosine decay to 10%
        if step < args.warmup:
            return (step + 1) / args.warmup
        t = (step - args.warmup) / max(1, args.steps - args.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model, opt, sched, train_loader, val_loader = rt.setup(
        model, opt, sched, train_loader, val_loader
    )
    params = sum(p.numel() for p in rt.unwrap(model).parameters())
    rt.print(
        f"gpt: {params / 1e6:.2f}M parameters, vocab {len(chars)}, {len(train) / 1e3:.0f}K train chars, "
        f"{rt.world_size} x {rt.device} ({rt.backend}, {rt.precision.name})"
    )
    rt.print(f"gpt: unigram baseline (validation loss of a context-free model): {baseline:.4f}")
    start = rt.resume()

    @torch.no_grad()
    def evaluate() -> float:
        model.eval()
        total = torch.zeros((), device=rt.device)
        count = 0
        for i, (x, y) in enumerate(val_loader):
            if i >= args.eval_batches:
                break
            with rt.autocast():
                logits = model(x)
            total += F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
            count += 1
        model.train()
        return float(rt.all_reduce(total / max(1, count)).item())

    tokens_per_step = args.batch_size * args.block_size * rt.world_size * rt.config.grad_accum
    bar = rt.progress(args.steps, "gpt")
    t0 = time.perf_counter()
    loss_sum = torch.zeros((), device=rt.device)
    loss_n = 0
    train_loss = float("nan")
    val_loss = float("nan")
    while rt.global_step < args.steps:
        for x, y in train_loader:
            with rt.accumulate(model), rt.autocast():
                logits = model(x)
                loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
                rt.backward(loss)
            loss_sum += loss.detach()
            loss_n += 1
            if not rt.step(opt):
                continue
            sched.step()
            step = rt.global_step
            if step % rt.config.logging.every == 0 or step == args.steps:
                train_loss = float(rt.all_reduce(loss_sum / loss_n).item())
                loss_sum.zero_()
                loss_n = 0
                rt.log({"train/loss": train_loss, "lr": sched.get_last_lr()[0]}, step)
                bar.update(step, loss=train_loss)
            if step % args.eval_every == 0 or step == args.steps:
                val_loss = evaluate()
                rt.log({"val/loss": val_loss}, step)
                bar.update(step, loss=train_loss, val=val_loss)
            if step >= args.steps:
                break
    bar.close()
    elapsed = time.perf_counter() - t0
    done = rt.global_step - start
    if done == 0:
        # resumed at (or past) the last step: say so instead of a summary of nothing
        val_loss = evaluate()
        rt.print(
            f"gpt: nothing left to train: the checkpoint in {rt.config.checkpoint.dir} is at step "
            f"{rt.global_step} of --steps {args.steps} (another checkpoint.dir, "
            f"checkpoint.resume=false or a higher --steps trains again); val loss {val_loss:.4f} "
            f"vs unigram baseline {baseline:.4f}"
        )
        rt.log({"summary/val_loss": val_loss, "summary/baseline": baseline})
        rt.close()
        return
    if os.environ.get("GPT_SAMPLE", "1") != "0":
        # every rank runs the model (under fsdp/tp a forward is collective); rank 0 prints
        g = torch.Generator().manual_seed(0)  # CPU generator: same sample on every backend
        prompt = (
            val[: args.block_size].unsqueeze(0).to(rt.device)
        )  # a full context from held-out text
        sample = rt.unwrap(model).generate(prompt, 160, g)[0, args.block_size :].tolist()
        rt.print("gpt: prompt: " + "".join(chars[i] for i in prompt[0].tolist()).replace("\n", " "))
        rt.print("gpt: sample: " + "".join(chars[i] for i in sample).replace("\n", " "))
    rt.print(
        f"gpt: done {rt.global_step} steps ({done} this run) in {elapsed:.1f}s: "
        f"{done / max(elapsed, 1e-9):.2f} steps/s, "
        f"{done * tokens_per_step / max(elapsed, 1e-9):,.0f} tokens/s; train loss {train_loss:.4f}, "
        f"val loss {val_loss:.4f} vs unigram baseline {baseline:.4f} "
        f"({abs(baseline - val_loss):.4f} {'below' if val_loss < baseline else 'ABOVE'} it)"
    )
    rt.log(
        {
            "summary/val_loss": val_loss,
            "summary/baseline": baseline,
            "summary/tokens_per_s": done * tokens_per_step / max(elapsed, 1e-9),
        }
    )
    rt.close()


if __name__ == "__main__":
    main()
