"""A nanoGPT-style ``train.py`` (karpathy/nanoGPT's habits: a module-level config, per-rank
seeds, ``torch.randint`` batches, evaluation and "save when validation improves" at the top of
the loop, the loss divided by the accumulation steps), ported to aios as the README's
"Porting a training loop" says: no environment reading, no wrapper class.

    aios-run --nprocs 2 tests/idioms/nanogpt_train.py            # ddp
    aios-run --nprocs 2 strategy=fsdp tests/idioms/nanogpt_train.py
"""

import hashlib
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import aios
import torch
import torch.nn as nn
from torch.nn import functional as F

# -----------------------------------------------------------------------------
out_dir = sys.argv[1] if len(sys.argv) > 1 else "out"
eval_interval = 3
eval_iters = 2
max_iters = 12
batch_size = 4  # micro-batch size
global_batch = 16  # nanoGPT: gradient_accumulation_steps * ddp_world_size * batch_size
block_size = 16
n_layer, n_head, n_embd, dropout = 2, 2, 16, 0.1
learning_rate, min_lr, warmup_iters = 1e-2, 1e-3, 2
grad_clip = 1.0
# -----------------------------------------------------------------------------

# was: ddp = int(os.environ.get('RANK', -1)) != -1; init_process_group(...);
# gradient_accumulation_steps //= ddp_world_size
rt = aios.init(
    defaults={
        "global_batch": global_batch,
        "micro_batch": batch_size,
        "grad_clip": grad_clip,
        "checkpoint": {"dir": out_dir, "every": 3},
    }
)
master_process = rt.is_main
torch.manual_seed(1337 + rt.rank)  # nanoGPT's seed_offset = ddp_rank

text = (Path(__file__).resolve().parents[2] / "examples" / "data" / "corpus.txt").read_text()
chars = sorted(set(text))
data = torch.tensor([chars.index(c) for c in text[:20000]], dtype=torch.long)
n = int(0.9 * len(data))
train_data, val_data = data[:n], data[n:]


def get_batch(split):
    data = train_data if split == "train" else val_data
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([data[i : i + block_size] for i in ix])
    y = torch.stack([data[i + 1 : i + 1 + block_size] for i in ix])
    return x.to(rt.device), y.to(rt.device)


@dataclass
class GPTConfig:
    block_size: int
    vocab_size: int
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0, is_causal=True
        )
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(config.n_embd), nn.LayerNorm(config.n_embd)
        self.attn, self.mlp = CausalSelfAttention(config), MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            torch.nn.init.zeros_(module.bias)

    def forward(self, idx, targets):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def digest(model):
    """sha256 of the whole model (sharded parameters gathered: collective)."""
    h = hashlib.sha256()
    for _, v in sorted(rt.unwrap(model).state_dict().items()):
        v = v.full_tensor() if hasattr(v, "full_tensor") else v
        h.update(v.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


model = GPT(GPTConfig(block_size, len(chars), n_layer, n_head, n_embd, dropout))
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(0.9, 0.95))
model, optimizer = rt.setup(model, optimizer)
print(f"init model {digest(model)}")  # every rank: the same model
rt.resume()  # was: init_from = 'resume' and torch.load(ckpt_path)


@torch.no_grad()
def estimate_loss():  # every rank evaluates (a sharded model's forward is collective)
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            with rt.autocast():
                _, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = rt.all_reduce(losses.mean()).item()
    model.train()
    return out


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    ratio = (it - warmup_iters) / (max_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


while True:
    iter_num = rt.global_step
    lr = get_lr(iter_num)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    if iter_num % eval_interval == 0 and iter_num > 0:
        losses = estimate_loss()
        rt.print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        if rt.save_best(losses["val"]):  # was: if losses['val'] < best_val_loss: torch.save(...)
            rt.print(f"saving best at step {iter_num}")
    if iter_num >= max_iters:
        break
    for _micro_step in range(rt.grad_accum):
        X, Y = get_batch("train")  # drawn where it is used: no batch prefetched across rt.step
        with rt.accumulate(model), rt.autocast():
            logits, loss = model(X, Y)
            loss = loss / rt.grad_accum  # nanoGPT divides itself ...
            rt.backward(loss, divide=False)  # ... so aios does not divide again
    rt.step(optimizer)  # clip (grad_clip), step, zero_grad, checkpoint when due
    rt.print(f"iter {iter_num}: loss {loss.item() * rt.grad_accum!r}")

print(f"final model {digest(model)}")
rt.close()
