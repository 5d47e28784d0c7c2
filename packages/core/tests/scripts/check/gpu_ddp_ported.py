"""gpu_ddp.py after `aios check --fix` and the remaining findings addressed as suggested:
`aios-run --nprocs 2 gpu_ddp_ported.py` on any backend."""

import sys
import time

import aios
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def ddp_setup():
    init_process_group()
    aios.init()  # joins the group made above; each rank gets its device


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path):
        self.rt = aios.init()
        self.gpu_id = self.rt.local_rank
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.snapshot_path = snapshot_path
        self.model = self.rt.setup(self.model)

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        with self.rt.autocast():
            output = self.model(source)
            loss = F.mse_loss(output, targets)
        self.rt.backward(loss)
        self.rt.step(self.optimizer)
        return loss.detach()

    def _run_epoch(self, epoch):
        self.train_data.sampler.set_epoch(epoch)
        total = torch.zeros((), device=self.rt.device)
        for source, targets in self.train_data:
            source = source.to(self.rt.device)
            targets = targets.to(self.rt.device, non_blocking=True)
            total += self._run_batch(source, targets)
        dist.all_reduce(total)
        return total.item()

    def _save_checkpoint(self, epoch):
        self.rt.save(f"{self.snapshot_path}.{epoch}")
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}")

    def train(self, max_epochs):
        for epoch in range(max_epochs):
            t0 = time.time()
            loss = self._run_epoch(epoch)
            if torch.accelerator.is_available():
                torch.accelerator.synchronize()
            if self.gpu_id == 0:
                print(f"epoch {epoch} loss {loss:.4f} {time.time() - t0:.2f}s")
            if epoch % self.save_every == 0:
                self._save_checkpoint(epoch)


def load_train_objs():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return data, model, optimizer


def main(save_every, total_epochs, batch_size, snapshot_path="snapshot.pt"):
    ddp_setup()
    dataset, model, optimizer = load_train_objs()
    loader = DataLoader(
        dataset, batch_size=batch_size, shuffle=False, sampler=DistributedSampler(dataset)
    )
    print(f"rank {dist.get_rank()} of {torch.accelerator.device_count()} GPUs")
    trainer = Trainer(model, loader, optimizer, save_every, snapshot_path)
    trainer.train(total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    main(save_every=1, total_epochs=int(sys.argv[1]) if len(sys.argv) > 1 else 2, batch_size=32)
