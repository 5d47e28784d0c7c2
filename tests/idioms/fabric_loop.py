"""A Lightning-Fabric-style loop (``fabric.setup``, ``fabric.setup_dataloaders``,
``fabric.backward``, ``optimizer.step()`` then ``scheduler.step()``, and a ``state`` dict of
model, optimizer and counters that ``fabric.save``/``fabric.load`` round-trip in place), ported
to aios as the README says.

    aios-run --nprocs 2 tests/idioms/fabric_loop.py CKPT_DIR
"""

import hashlib
import sys

import aios
import torch
import torch.nn as nn
import torch.nn.functional as F


def digest(rt, model):
    h = hashlib.sha256()
    for _, v in sorted(rt.unwrap(model).state_dict().items()):
        v = v.full_tensor() if hasattr(v, "full_tensor") else v
        h.update(v.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(12, 12) for _ in range(3)])
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(12, 3)

    def forward(self, x):
        for layer in self.layers:
            x = self.drop(F.relu(layer(x)))
        return self.head(x)


def main(ckpt_dir):
    # was: fabric = L.Fabric(accelerator="auto", devices=2, strategy="ddp"); fabric.launch()
    rt = aios.init(defaults={"checkpoint": {"dir": ckpt_dir, "every": 5}})
    torch.manual_seed(42 + rt.rank)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(
        torch.randn(96, 12, generator=g), torch.randint(0, 3, (96,), generator=g)
    )
    dataloader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    # was: model, optimizer = fabric.setup(model, optimizer); fabric.setup_dataloaders(...)
    model, optimizer, scheduler, dataloader = rt.setup(model, optimizer, scheduler, dataloader)
    print(f"init model {digest(rt, model)}")
    # was: state = {"model": model, "optimizer": optimizer, "iteration": 0};
    # fabric.load(path, state) -- aios saves model/optimizer/scheduler itself; the counters:
    state = rt.register("state", {"iteration": 0, "epoch": 0})
    rt.resume()
    while state["epoch"] < 2:
        model.train()
        for x, y in dataloader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            rt.backward(loss)  # was: fabric.backward(loss)
            rt.step(optimizer)  # was: optimizer.step()
            scheduler.step()
            state["iteration"] += 1
            rt.print(f"iter {state['iteration']}: loss {loss.item()!r}")
        state["epoch"] += 1
    print(f"final model {digest(rt, model)}")
    rt.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "ckpt")
