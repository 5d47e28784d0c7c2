"""Training state: what a checkpoint holds, separate from how and where it is written.

:class:`TrainingState` keeps the objects a :class:`aios.runtime.Runtime` set up or registered
(models, optimizers, LR schedulers, data loaders, named objects), the step counters, and
produces/consumes the full state dict (model/optimizer state through the strategy, which knows
about data-parallel wrappers and sharding; loader positions; the precision state; RNG states).
It writes no files and talks to no other process: the checkpoint manager
(:mod:`aios.checkpoint.manager`) does the I/O and the collectives.

It can be built and tested alone with any :class:`aios.strategies.base.Strategy` and
:class:`aios.strategies.precision.Precision`.
"""

from __future__ import annotations

import contextlib
import os
import random
from typing import Any

from aios.checkpoint import own
from aios.data import rng
from aios.data.rng import reseed, reseed_value
from aios.errors import AiosError, CheckpointError

#: version of the state dict layout below
STATE_FORMAT = 1


class TrainingState:
    """Registered objects, counters and the (de)serialisation of the full training state."""

    def __init__(self, strategy: Any, precision: Any, backend: str) -> None:
        self.strategy = strategy
        self.precision = precision
        self.backend = backend
        self.world_size = int(strategy.world_size)
        #: optimizer steps taken
        self.step = 0
        #: micro-steps (backward calls) taken
        self.micro = 0
        self.modules: list[Any] = []
        self.optimizers: list[Any] = []
        self.schedulers: list[Any] = []
        self.loaders: list[Any] = []
        self.objects: dict[str, Any] = {}
        #: registered plain values (see :meth:`register`)
        self.values: dict[str, Any] = {}
        #: saved states of objects not registered when the checkpoint was loaded
        self.unclaimed: dict[str, Any] = {}
        #: the run's ``seed`` (set by the checkpoint manager): random streams of a rank that
        #: has no saved state of its own (see :meth:`restore_rng`) derive from it
        self.seed: int | None = None

    # ---------------------------------------------------------------- registration
    def register(self, name: str, obj: Any) -> Any:
        """Include ``obj`` in checkpoints under ``name``: anything with ``state_dict()`` and
        ``load_state_dict()``, or a plain value (number, string, bool, None, tensor, or a
        dict/list/tuple of those) kept in :attr:`values`. A dict or list is restored in
        place (the object the script holds is updated); any other value is read back from
        ``values[name]``. Registered after a resume, it gets the resumed value at once."""
        if hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict"):
            self.objects[name] = obj
        else:
            bad = _not_plain(obj)
            if bad is not None:
                raise AiosError(
                    f"runtime.register({name!r}, ...) needs an object with state_dict() and "
                    f"load_state_dict() or a plain value, and got {bad}",
                    "register numbers, strings, tensors and dicts/lists of them, or objects "
                    "with state_dict()/load_state_dict()",
                )
            self.values[name] = obj
            self.objects[name] = _ValueSlot(self.values, name)
        if name in self.unclaimed:
            self.objects[name].load_state_dict(self.unclaimed.pop(name))
        return self.values[name] if name in self.values else obj

    def load_objects(self, states: dict[str, Any]) -> None:
        """Restore registered objects; states of names not registered (yet) wait in
        :attr:`unclaimed` for :meth:`register`."""
        for k, st in states.items():
            if k in self.objects:
                self.objects[k].load_state_dict(st)
            else:
                self.unclaimed[k] = st

    @property
    def main_module(self) -> Any:
        return self.modules[0] if self.modules else None

    # ---------------------------------------------------------------- state dict
    def state_dict(self) -> dict[str, Any]:
        """The full training state of this process (model/optimizer tensors on CPU), without
        RNG states (those are gathered from every rank by the checkpoint manager)."""
        s = self.strategy
        module = self.main_module
        return {
            "format": STATE_FORMAT,
            "step": self.step,
            "micro": self.micro,
            "modules": [s.module_state_dict(m) for m in self.modules],
            "optimizers": [s.optimizer_state_dict(o, module) for o in self.optimizers],
            "schedulers": [sch.state_dict() for sch in self.schedulers],
            "loaders": [
                ld.state_dict() if hasattr(ld, "state_dict") else None for ld in self.loaders
            ],
            "objects": {k: v.state_dict() for k, v in self.objects.items()},
            "precision": self.precision.state_dict(),
            "world_size": self.world_size,
            "backend": self.backend,
        }

    def load_state_dict(self, state: dict[str, Any], strict: bool = True, rank: int = 0) -> None:
        s = self.strategy
        counts = {
            "modules": len(self.modules),
            "optimizers": len(self.optimizers),
            "schedulers": len(self.schedulers),
        }
        for key, n in counts.items():
            if len(state.get(key, [])) != n:
                raise CheckpointError(
                    f"the checkpoint holds {len(state.get(key, []))} {key} but this script set up {n}",
                    "set up the same models/optimizers/schedulers as the run that saved it, "
                    "or start fresh with checkpoint.resume=false",
                )
        module = self.main_module
        try:
            for m, st in zip(self.modules, state["modules"], strict=True):
                if strict:
                    s.load_module_state_dict(m, st)
                else:
                    s.unwrap(m).load_state_dict(st, strict=False)
            for o, st in zip(self.optimizers, state["optimizers"], strict=True):
                s.load_optimizer_state_dict(o, st, module)
        except (RuntimeError, ValueError, KeyError) as exc:
            raise CheckpointError(
                f"the checkpoint does not fit this model/optimizer ({str(exc).splitlines()[0][:200]})",
                "use the model definition that saved it, or start fresh with checkpoint.resume=false",
            ) from None
        for sch, st in zip(self.schedulers, state["schedulers"], strict=True):
            sch.load_state_dict(st)
        for ld, st in zip(self.loaders, state.get("loaders", []), strict=False):
            if st is not None and hasattr(ld, "load_state_dict"):
                ld.load_state_dict(st)
        self.load_objects(state.get("objects", {}))
        self.precision.load_state_dict(state.get("precision", {}))
        self.step = int(state.get("step", 0))
        self.micro = int(state.get("micro", 0))
        rngs = state.get("rng") or []
        if rngs:
            self.restore_rng(rngs[rank] if rank < len(rngs) else None, rank, state.get("backend"))

    def own_state_dict(self) -> dict[str, Any]:
        """What a rank of the same shape takes as its own (a replica group's heal,
        :mod:`aios.ft.replica`): :meth:`state_dict` with the models and optimizers as this rank
        holds them (its shards under a sharded strategy), read without a collective
        (:mod:`aios.checkpoint.own`), and without the loaders (their positions are the
        replica data's)."""
        s = self.strategy
        return {
            "format": STATE_FORMAT,
            "step": self.step,
            "modules": [own.module_state(s.unwrap(m)) for m in self.modules],
            "optimizers": [own.optimizer_state(o) for o in self.optimizers],
            "schedulers": [sch.state_dict() for sch in self.schedulers],
            "objects": {k: v.state_dict() for k, v in self.objects.items()},
            "precision": self.precision.state_dict(),
        }

    def load_own_state_dict(self, state: dict[str, Any]) -> None:
        """Take :meth:`own_state_dict` of the same rank of a live peer, without a collective;
        this rank's micro-step count stays its own (the peer sent its state mid-step)."""
        s = self.strategy
        if len(state["modules"]) != len(self.modules) or len(state["optimizers"]) != len(
            self.optimizers
        ):
            raise CheckpointError(
                "a live replica group holds another set of models/optimizers than this one",
                "set up the same models and optimizers in every replica group",
            )
        try:
            for m, st in zip(self.modules, state["modules"], strict=True):
                own.load_module_state(s.unwrap(m), st)
            for o, st in zip(self.optimizers, state["optimizers"], strict=True):
                own.load_optimizer_state(o, st)
        except (RuntimeError, ValueError, KeyError) as exc:
            raise CheckpointError(
                f"a live replica group's state does not fit this group "
                f"({str(exc).splitlines()[0][:200]})",
                "run the same script and settings in every replica group",
            ) from None
        for sch, st in zip(self.schedulers, state["schedulers"], strict=True):
            sch.load_state_dict(st)
        self.load_objects(state.get("objects", {}))
        self.precision.load_state_dict(state.get("precision", {}))
        self.step = int(state["step"])

    # ---------------------------------------------------------------- RNG
    def seed_everything(self, seed: int) -> None:
        """Seed Python, NumPy, torch and the device RNG (the same seed on every rank)."""
        import torch

        random.seed(seed)
        with contextlib.suppress(ImportError):
            import numpy as np

            np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
        self.strategy.seed(seed)

    @staticmethod
    def deterministic() -> None:
        import torch

        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        if hasattr(torch.backends, "cudnn"):
            torch.backends.cudnn.benchmark = False

    def restore_rng(self, saved: dict[str, Any] | None, rank: int, saved_backend: Any) -> None:
        """The random streams of ``rank`` after a load: its saved ones when the saving run had
        this rank (the device's only when it was the same backend: otherwise the device stream
        is derived); a rank the saving run did not have derives every stream deterministically
        from ``(seed, step, rank)`` (:func:`aios.data.rng.reseed`). Equal to an
        uninterrupted run only at the same shape."""
        if saved is None:
            self.strategy.seed(reseed(self.seed, self.step, rank))
            return
        if saved_backend is not None and saved_backend != self.backend:
            self.set_rng_state({k: v for k, v in saved.items() if k != "device"})
            self.strategy.seed(reseed_value(self.seed, self.step, rank))
            return
        self.set_rng_state(saved)

    def rng_state(self) -> dict[str, Any]:
        """This process's RNG states with the strategy's device part (:func:`aios.data.rng.capture`)."""
        return rng.capture(self.strategy.rng_state())

    def set_rng_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`rng_state`'s result (:func:`aios.data.rng.restore`; the device part through
        the strategy)."""
        device = rng.restore(state)
        if device:
            self.strategy.set_rng_state(device)


_PLAIN = (int, float, bool, str, bytes, type(None))


def _not_plain(obj: Any) -> str | None:
    """None when ``obj`` is a plain value a checkpoint can hold (loaded with
    ``weights_only=True``), else the name of the first type that is not."""
    import torch

    if isinstance(obj, (*_PLAIN, torch.Tensor)):
        return None
    if isinstance(obj, dict):
        for k, v in obj.items():
            bad = _not_plain(k) or _not_plain(v)
            if bad:
                return bad
        return None
    if isinstance(obj, (list, tuple)):
        for v in obj:
            bad = _not_plain(v)
            if bad:
                return bad
        return None
    return type(obj).__name__


class _ValueSlot:
    """The checkpoint face of a registered plain value: ``values[name]`` as it is at save
    time; on load a dict or list is updated in place, anything else replaced."""

    def __init__(self, values: dict[str, Any], name: str) -> None:
        self.values, self.name = values, name

    def state_dict(self) -> dict[str, Any]:
        import copy

        return {"value": copy.deepcopy(self.values[self.name])}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved, current = state["value"], self.values.get(self.name)
        if isinstance(current, dict) and isinstance(saved, dict):
            current.clear()
            current.update(saved)
        elif isinstance(current, list) and isinstance(saved, list):
            current[:] = saved
        else:
            self.values[self.name] = saved
