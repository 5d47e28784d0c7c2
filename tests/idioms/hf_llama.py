"""A model from the ``transformers`` library, built from a tiny config (random init, nothing
downloaded), trained in the habits of a plain PyTorch loop around a Hugging Face model
(``outputs = model(input_ids=..., labels=...)``, ``outputs.loss``,
``get_linear_schedule_with_warmup``), ported to aios as the README says. Under
``strategy=fsdp`` the decoder layers are the FSDP units: ``fsdp.wrap=[LlamaDecoderLayer]``.

    aios-run --nprocs 2 strategy=fsdp fsdp.wrap=[LlamaDecoderLayer] tests/idioms/hf_llama.py CKPT
"""

import hashlib
import sys

import aios
import torch
from transformers import LlamaConfig, LlamaForCausalLM, get_linear_schedule_with_warmup


def digest(rt, model):
    h = hashlib.sha256()
    for _, v in sorted(rt.unwrap(model).state_dict().items()):
        v = v.full_tensor() if hasattr(v, "full_tensor") else v
        h.update(v.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def main(ckpt_dir):
    rt = aios.init(defaults={"grad_accum": 2, "checkpoint": {"dir": ckpt_dir, "every": 3}})
    torch.manual_seed(1234 + rt.rank)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
        attention_dropout=0.1,
    )
    model = LlamaForCausalLM(config)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (64, 16), generator=g)
    loader = torch.utils.data.DataLoader(ids, batch_size=4, shuffle=True, drop_last=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=2, num_training_steps=8)
    model, optimizer, scheduler, loader = rt.setup(model, optimizer, scheduler, loader)
    print(f"init model {digest(rt, model)} blocks {len(getattr(rt.strategy, 'blocks', []))}")
    rt.resume()
    model.train()
    while rt.global_step < 8:
        for input_ids in loader:
            with rt.accumulate(model):
                outputs = model(input_ids=input_ids, labels=input_ids)
                rt.backward(outputs.loss)
            if rt.step(optimizer):
                scheduler.step()
                rt.print(f"iter {rt.global_step}: loss {outputs.loss.item()!r}")
            if rt.global_step >= 8:
                break
    print(f"final model {digest(rt, model)}")
    rt.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "ckpt")
