"""A torchrun-style DDP script (pytorch/examples ``distributed/ddp-tutorial-series/
multigpu_torchrun.py``: a ``Trainer`` class, ``DistributedSampler``, ``set_epoch``, a snapshot
every few epochs and ``epochs_run`` restored from it), ported to aios as the README says.

    aios-run --nprocs 2 tests/idioms/torchrun_ddp.py CKPT_DIR
"""

import hashlib
import sys

import aios
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class MyTrainDataset(Dataset):
    def __init__(self, size):
        self.size = size
        self.data = [(torch.rand(20), torch.rand(1)) for _ in range(size)]

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.data[index]


class Trainer:
    def __init__(self, rt, model, train_data, optimizer, save_every):
        # was: self.gpu_id = int(os.environ["LOCAL_RANK"]); DDP(model, device_ids=[...]);
        # DistributedSampler(dataset); if os.path.exists(snapshot_path): self._load_snapshot()
        self.rt = rt
        self.model, self.optimizer, self.train_data = rt.setup(model, optimizer, train_data)
        self.save_every = save_every
        self.progress = rt.register("trainer", {"epochs_run": 0})  # restored in place
        rt.resume()

    def _run_batch(self, source, targets):
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        self.rt.backward(loss)
        self.rt.step(self.optimizer)  # was: optimizer.zero_grad(); loss.backward(); step()
        self.rt.print(f"iter {self.rt.global_step}: loss {loss.item()!r}")

    def _run_epoch(self, epoch):
        # was: self.train_data.sampler.set_epoch(epoch) (aios's sampler does it, resumable)
        for source, targets in self.train_data:
            self._run_batch(source, targets)

    def train(self, max_epochs):
        while self.progress["epochs_run"] < max_epochs:
            self._run_epoch(self.progress["epochs_run"])
            self.progress["epochs_run"] += 1
            # was: if gpu_id == 0 and epoch % save_every == 0: self._save_snapshot(epoch)
            # (aios checkpoints every checkpoint.every steps, every rank, atomically)


def digest(rt, model):
    h = hashlib.sha256()
    for _, v in sorted(rt.unwrap(model).state_dict().items()):
        v = v.full_tensor() if hasattr(v, "full_tensor") else v
        h.update(v.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def main(total_epochs, batch_size, snapshot_dir):
    rt = aios.init(defaults={"checkpoint": {"dir": snapshot_dir, "every": 4}})  # was: ddp_setup()
    torch.manual_seed(rt.rank)  # each rank its own stream: the model comes from rank 0 anyway
    dataset = MyTrainDataset(64)
    model = torch.nn.Sequential(
        torch.nn.Linear(20, 16), torch.nn.Dropout(0.1), torch.nn.Linear(16, 1)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True)
    trainer = Trainer(rt, model, loader, optimizer, save_every=1)
    print(f"init model {digest(rt, trainer.model)}")
    trainer.train(total_epochs)
    print(f"final model {digest(rt, trainer.model)}")
    rt.close()  # was: destroy_process_group()


if __name__ == "__main__":
    main(total_epochs=3, batch_size=8, snapshot_dir=sys.argv[1] if len(sys.argv) > 1 else "snap")
