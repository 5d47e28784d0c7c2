"""The cross-group all-reduce of a replica group's gradients while its backward runs.

As DDP's reducer does inside one world: the parameters are split, in the reverse order of their
registration (about the order backward produces their gradients), into buckets of
:data:`BUCKET_BYTES`; a hook on each parameter (``register_post_accumulate_grad_hook``) notes
its gradient, and the bucket whose gradients are all there is flattened and handed to torchft's
fault-tolerant all-reduce at once, so the transfer of the first buckets overlaps the backward of
the remaining layers. At the commit (:meth:`GradientBuckets.finish`) the buckets not launched yet
(parameters without a gradient this step) go too, every one is waited for and the averaged
gradients are copied back.

Only for a group of one process with plain tensor parameters (:func:`eligible`): inside a group
of several processes the group's own reducer averages a gradient after its hook has fired, and a
sharded strategy's gradients appear at the end of its own backward; those groups all-reduce one
flat tensor at the commit (:meth:`aios.ft.replica.Replica.commit`). Every group builds the same
buckets from the same model, so the all-reduces pair up across groups in the same order.

Torch is imported by the functions (a rank under replica groups has it loaded already).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: the bytes of gradients per all-reduce (DDP's default bucket size)
BUCKET_BYTES = 25 * 2**20


def eligible(group_world: int, params: list[Any]) -> bool:
    """Whether the gradients of ``params`` can be all-reduced as backward produces them."""
    from torch.distributed.tensor import DTensor

    return group_world == 1 and bool(params) and not any(isinstance(p, DTensor) for p in params)


class GradientBuckets:
    """The buckets of one group's parameters and their all-reduces (see the module docstring).
    ``allreduce(flat)`` starts the cross-group all-reduce of a flat tensor and returns what to
    ``wait()`` on."""

    def __init__(
        self,
        params: list[Any],
        allreduce: Callable[[Any], Any],
        bucket_bytes: int = BUCKET_BYTES,
    ) -> None:
        self.allreduce = allreduce
        self.buckets: list[list[Any]] = [[]]
        size = 0
        for p in reversed(params):
            if size and size + p.numel() * p.element_size() > bucket_bytes:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += p.numel() * p.element_size()
        self._where = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        self._ready: list[set[int]] = [set() for _ in self.buckets]
        #: per bucket: (its gradients, the flat tensor, what to wait on), once launched
        self._sent: dict[int, tuple[list[Any], Any, Any]] = {}
        self.armed = False
        self._hooks = [p.register_post_accumulate_grad_hook(self._noted) for p in params]

    def arm(self) -> None:
        """The next backward is a step's last: launch each bucket as its gradients are there.
        The all-reduces of a backward no commit followed are waited for and dropped (every
        group ran the same script, so they were paired)."""
        for _, _, work in self._sent.values():
            if work is not None:
                work.wait()
        self._sent.clear()
        for ready in self._ready:
            ready.clear()
        self.armed = True

    def _noted(self, p: Any) -> None:
        if not self.armed:
            return
        i = self._where[id(p)]
        self._ready[i].add(id(p))
        if len(self._ready[i]) == len(self.buckets[i]) and i not in self._sent:
            self._launch(i)

    def _launch(self, i: int) -> None:
        import torch

        grads = [p.grad for p in self.buckets[i] if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads]) if grads else None
        self._sent[i] = (grads, flat, self.allreduce(flat) if flat is not None else None)

    def finish(self) -> None:
        """Launch the buckets still waiting, wait for every one, copy the averaged gradients
        back; the buckets are ready for the next step."""
        for i in range(len(self.buckets)):
            if i not in self._sent:
                self._launch(i)
        for i in range(len(self.buckets)):
            grads, flat, work = self._sent[i]
            if work is None:
                continue
            work.wait()
            at = 0
            for g in grads:
                n = g.numel()
                g.copy_(flat[at : at + n].view_as(g))
                at += n
        self._sent.clear()
        for ready in self._ready:
            ready.clear()
        self.armed = False

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
