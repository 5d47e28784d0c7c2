"""A rank's side of ``ft.replica_groups``: its group's torchft manager and the step protocol.

* step start (the first batch of the step from an aios loader, else the first ``rt.backward``):
  the quorum (:meth:`Replica.begin_step`); the groups in it are this step's participants;
* ``rt.step``, before the optimizer: the gradients averaged across the participating groups by
  the manager's fault-tolerant all-reduce (one flat tensor), then the commit vote
  (``should_commit``); the optimizer steps only when the step commits (a step that did not
  commit is trained again: its data stays next, :mod:`aios.ft.data`);
* a restarted group joins the next quorum, receives the training state of a live group over
  torchft's HTTP checkpoint transport (no checkpoint file), does not contribute to that step's
  gradients and steps with the others: its parameters are then bitwise those of its peers.

A restarted group that finds every other group finished before it could heal (the survivors
trained its share of the data and ended the run's script) has nothing to train: it ends at its
first step without training and without writing a checkpoint, and says so
(:attr:`Replica.end_alone`).

Lines (rank 0 of a group): when the number of groups in the quorum changes, when this group
healed (with the time from its restart to its first committed step), and when it ends alone.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NoReturn

from aios.ft import (
    GROUP_ENV,
    GROUPS_ENV,
    LIGHTHOUSE_ENV,
    RESTARTED_AT_ENV,
    RUN_STORE_ENV,
    STATE_DIR_ENV,
    STORE_PORT_ENV,
    done_key,
    ready_key,
    ready_path,
)
from aios.ft.hang import Beat, quorum_timeout
from aios.ft.transport import bound_transport


def _exit_zero() -> NoReturn:
    raise SystemExit(0)


def from_env(environ: Any = os.environ) -> tuple[int, int] | None:
    """``(group, groups)`` when this rank was started in a replica group by aios-run."""
    if GROUP_ENV not in environ:
        return None
    return int(environ[GROUP_ENV]), int(environ[GROUPS_ENV])


class Replica:
    """This rank's replica group (see the module docstring)."""

    def __init__(self, cfg: Any, training: Any, strategy: Any, environ: Any = os.environ) -> None:
        self.cfg = cfg
        self.training = training
        self.strategy = strategy
        self.env = environ
        self.group = int(environ[GROUP_ENV])
        self.groups = int(environ[GROUPS_ENV])
        self.group_rank = int(strategy.rank)
        self.group_world = int(strategy.world_size)
        #: this rank's data-parallel rank and the group's data-parallel ranks (the strategy's:
        #: the tp ranks of one dp rank read the same batch, :mod:`aios.ft.data`)
        self.data_rank = int(strategy.data_rank)
        self.data_world = int(strategy.data_world)
        self.manager: Any = None
        self._store: Any = None
        #: node 0's store, when the groups span hosts (:meth:`_run_store`)
        self._runs: Any = None
        self.in_step = False
        #: groups in this step's quorum (those that contribute gradients)
        self.participants = self.groups
        #: this group's index among them (None: healing this step)
        self.participant_rank: int | None = self.group
        self.samplers: list[Any] = []
        #: the all-reduce buffer kept across steps (:meth:`_flat`)
        self._buf: Any = None
        restarted = environ.get(RESTARTED_AT_ENV)
        self._restarted_at = float(restarted) if restarted else None
        #: goodput: steps committed, committed with fewer groups, not committed; heal seconds
        self.counts = {"committed": 0, "degraded": 0, "lost": 0}
        self.heal_seconds: float | None = None
        self._healing = False
        state_dir = environ.get(STATE_DIR_ENV)
        #: the step of this rank's last quorum request, read by aios-run's hang watch (aios.ft.hang)
        self.beat = Beat(state_dir, self.group, self.group_rank) if state_dir else None
        #: a stop notice (SIGTERM) some group had heard by a committed step's all-reduce: every
        #: group learns it at the same step, so every group stops at the same boundary
        self.notice = False
        #: ends this process when it was restarted after every other group finished (nothing
        #: left to train): the runtime closes without a checkpoint and exits 0
        self.end_alone: Callable[[], NoReturn] = _exit_zero
        #: False: not seen; True: seen, not said yet; None: said (by the first participant)
        self._said_eval: bool | None = False

    # ---------------------------------------------------------------- manager
    def _state(self) -> dict[str, Any]:
        # read on torchft's quorum thread while this rank waits for the quorum: this rank's own
        # shards only, no collective (aios.checkpoint.own)
        return {
            "training": self.training.own_state_dict(),
            "data": [s.state_dict() for s in self.samplers],
        }

    def _load(self, state: dict[str, Any]) -> None:
        # the same rank of a live group: its shards are this rank's (the loaders keep their
        # own counters: the position is the samplers', below)
        self.training.load_own_state_dict(state["training"])
        for s, d in zip(self.samplers, state["data"], strict=True):
            s.load_state_dict(d)

    def _start_manager(self) -> Any:
        if not self.cfg.ft.log:  # torchft's Python loggers (a traceback per lost peer): off
            logging.getLogger("torchft").setLevel(logging.CRITICAL)
        import torch.distributed as dist
        from torchft.manager import Manager
        from torchft.process_group import ProcessGroupGloo, ProcessGroupNCCL

        ft = self.cfg.ft
        timeout = timedelta(seconds=float(ft.timeout))
        addr = self.env["MASTER_ADDR"]
        port = int(self.env[STORE_PORT_ENV])
        if self.group_rank == 0:  # the group's store for the manager (its own port)
            self._store = dist.TCPStore(
                addr, port, is_master=True, wait_for_workers=False, timeout=timeout
            )
        pg_class = ProcessGroupNCCL if self.strategy.device.type == "cuda" else ProcessGroupGloo
        return Manager(
            pg=pg_class(timeout=timeout),
            load_state_dict=self._load,
            state_dict=self._state,
            min_replica_size=1,
            use_async_quorum=True,
            timeout=timeout,
            quorum_timeout=timedelta(seconds=quorum_timeout(ft)),  # outlasts the hang limit
            connect_timeout=timeout,
            rank=self.group_rank,
            world_size=self.group_world,
            store_addr=addr,
            store_port=port,
            lighthouse_addr=self.env[LIGHTHOUSE_ENV],
            replica_id=f"aios_{self.group}",
            hostname=addr,
            # the heal's transfer served on the run's address only (aios.ft.transport)
            checkpoint_transport=bound_transport(addr, timeout, quiet=not ft.log),
        )

    def start(self) -> None:
        """The group's manager: it heartbeats to the lighthouse from now on (the run's first
        quorum waits for every group)."""
        if self.manager is None:
            # torch's deserialisation of a received state warns once that the transfer buffer
            # is read-only (it is copied before use): not the script's business
            warnings.filterwarnings(
                "ignore",
                message="The given buffer is not writable",
                category=UserWarning,
                module="torch.distributed._serialization",
            )
            self.manager = self._start_manager()
            self._wait_for_groups()

    def _run_store(self) -> Any:
        """Node 0's store when the groups span hosts (``AIOS_FT_RUN_STORE``), else None."""
        where = self.env.get(RUN_STORE_ENV)
        if not where:
            return None
        if self._runs is None:
            import torch.distributed as dist

            host, port = where.rsplit(":", 1)
            timeout = timedelta(seconds=self.cfg.ft.join_timeout_ms / 1000.0)
            self._runs = dist.TCPStore(host, int(port), is_master=False, timeout=timeout)
        return self._runs

    def _wait_for_groups(self) -> None:
        """At the run's start every group joins the first quorum (a group restarted later
        does not wait: it heals from the live ones). On one host through files in aios-run's
        state folder; over several through node 0's store."""
        store = self._run_store()
        if store is not None:
            store.set(ready_key(self.group, self.group_rank), "1")
            if self._restarted_at is None:
                store.wait([ready_key(g, self.group_rank) for g in range(self.groups)])
            return
        state_dir = self.env.get(STATE_DIR_ENV)
        if not state_dir:
            return
        open(ready_path(state_dir, self.group, self.group_rank), "w").close()
        if self._restarted_at is not None:
            return
        want = [ready_path(state_dir, g, self.group_rank) for g in range(self.groups)]
        while not all(os.path.exists(w) for w in want):
            time.sleep(0.02)

    def _others_done(self) -> bool:
        others = [g for g in range(self.groups) if g != self.group]
        store = self._run_store()
        if store is not None:
            try:
                return bool(store.check([done_key(g) for g in others]))
            except (RuntimeError, OSError):  # node 0's aios-run has ended: so has the run
                return True
        state_dir = self.env.get(STATE_DIR_ENV, "")
        return all(os.path.exists(os.path.join(state_dir, f"group{g}.done")) for g in others)

    # ---------------------------------------------------------------- the step
    def evaluating(self) -> bool:
        """Whether the script's model is in ``eval()`` mode (a validation pass: its loaders
        read this group's own split, without a quorum, :mod:`aios.ft.data`)."""
        module = self.training.main_module
        if module is None:
            return False
        # eval() on what rt.setup returned, or on the script's own module inside its wrapper
        return not (module.training and self.strategy.unwrap(module).training)

    def begin_step(self) -> None:
        """The quorum of this step (once per step; a no-op until the step has ended)."""
        if self.in_step:
            return
        self.start()
        m = self.manager
        self._quorum()
        # a restarted group never trains alone: it asks again until its quorum has a live group
        # to heal from. Every other group finished first: the epoch's samples were trained by
        # them (its share included), so it ends here without training (never from step 0 alone:
        # that would train the data again, over the run's last checkpoint)
        while self._restarted_at is not None and self.heal_seconds is None:
            if m.participating_rank() is None or m.num_participants() > 1:
                break
            if self._others_done():
                self._say(
                    f"replica group {self.group} restarted after every other group had finished: "
                    "they trained its share of the data; it ends without training"
                )
                self.end_alone()
            time.sleep(0.05)
            self._quorum()
        self.in_step = True
        before = self.participants
        self.participants = int(m.num_participants())
        self.participant_rank = m.participating_rank()
        if self.participant_rank is None:
            self._healing = True  # receives a live group's state in this step's commit
        if self.participants != before and self.group_rank == 0 and self.participant_rank == 0:
            self._say(
                f"{self.participants} of {self.groups} replica groups training from step "
                f"{self.training.step}"
            )

    def attach(self, checkpointer: Any) -> None:
        """The run's checkpoints under replica groups: written by one group at a time
        (:meth:`writes_checkpoints`), their markers counting every group's processes."""
        checkpointer.writes = self.writes_checkpoints
        checkpointer.replicas = self.groups

    def writes_checkpoints(self) -> bool:
        """Whether this group writes the run's checkpoints now: the first of the groups in the
        last step's quorum (exactly one group; a healing group never)."""
        return self.participant_rank == 0

    def _quorum(self) -> None:
        # aios-run's hang watch: the step this request is from; a restarted group only once it
        # has healed (until then it is not judged, and it never makes a live group look behind)
        if self.beat is not None and (self._restarted_at is None or self.heal_seconds is not None):
            self.beat.tick(int(self.training.step))
        self.manager.start_quorum()
        self.manager.wait_quorum()

    def commit(self, modules: list[Any], noticed: bool = False) -> bool:
        """Average the gradients across the step's groups and vote; True when it commits.
        ``noticed``: this rank heard a stop notice; it rides the all-reduce (one more element),
        and :attr:`notice` is set in every group when the step commits."""
        import torch
        from torch.distributed.tensor import DTensor

        self.begin_step()
        m = self.manager
        grads = []
        for module in modules:
            for p in module.parameters():
                if p.grad is not None:
                    g = p.grad
                    grads.append(g.to_local() if isinstance(g, DTensor) else g)
        flat = self._flat(grads)
        torch.cat([*(g.reshape(-1) for g in grads), flat.new_full((1,), float(noticed))], out=flat)
        m.allreduce(flat).wait()
        at = 0
        for g in grads:
            n = g.numel()
            # copied back, never handed out as a view of the buffer: a gradient the script
            # keeps from this step stays this step's (the buffer is refilled next step)
            g.copy_(flat[at : at + n].view_as(g))
            at += n
        heard = bool(flat[-1].item() > 0)
        ok = bool(m.should_commit())
        if self._said_eval is False and any(s.in_eval_pass for s in self.samplers):
            self._said_eval = True  # said once, by the first group in the step's quorum
        if self._said_eval is True and self.participant_rank == 0:
            self._said_eval = None
            self._say(
                "a training step from a loader pass begun with the model in eval() mode: under "
                "ft.replica_groups such a pass is a validation pass (each group reads the whole "
                "set, not its share); call model.train() before training on it"
            )
        self.notice = self.notice or (ok and heard)
        self.in_step = False
        healed = self._healing and ok
        self._healing = self._healing and not ok
        for s in self.samplers:
            s.end_step(ok, self.participants)
        if not ok:
            self.counts["lost"] += 1
            self._say(f"step {self.training.step + 1} did not commit; it is trained again")
            return False
        self.counts["committed"] += 1
        if self.participants < self.groups:
            self.counts["degraded"] += 1
        if healed:
            since = self._restarted_at if self._restarted_at is not None else time.time()
            self.heal_seconds = time.time() - since
            self._say(
                f"replica group {self.group} healed from a live group at step "
                f"{self.training.step + 1}, {self.heal_seconds:.1f}s after its restart; "
                f"{self.participants} of {self.groups} groups training"
            )
        if self.group_rank == 0:
            state_dir = self.env.get(STATE_DIR_ENV)
            if state_dir:
                path = os.path.join(state_dir, f"group{self.group}.step")
                with open(path + ".tmp", "w") as f:
                    f.write(str(self.training.step + 1))
                os.replace(path + ".tmp", path)
        return True

    def _flat(self, grads: list[Any]) -> Any:
        """The step's all-reduce buffer: every gradient and the stop flag, end to end. One
        buffer is kept across steps (a fresh 25 MB tensor a step costs page faults); a new one
        when the gradients' sizes, dtype or device change, or when a gradient shares the
        buffer's storage."""
        import torch

        dtype = grads[0].dtype if grads else torch.float32
        for g in grads[1:]:
            dtype = torch.promote_types(dtype, g.dtype)
        device = grads[0].device if grads else torch.device("cpu")
        size = sum(g.numel() for g in grads) + 1
        buf = self._buf
        if (
            buf is None
            or buf.numel() != size
            or buf.dtype != dtype
            or buf.device != device
            or any(
                g.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr() for g in grads
            )
        ):
            buf = self._buf = torch.empty(size, dtype=dtype, device=device)
        return buf

    def summary(self) -> dict[str, Any]:
        """The goodput categories of this group (run record, ``aios report``)."""
        return {
            "replica_group": self.group,
            "replica_groups": self.groups,
            "steps_committed": self.counts["committed"],
            "steps_degraded": self.counts["degraded"],
            "steps_lost": self.counts["lost"],
            "heal_seconds": self.heal_seconds,
        }

    def _say(self, line: str) -> None:
        if self.group_rank == 0:
            print(f"aios: {line}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.beat is not None:
            self.beat.close()
        if self.manager is not None:
            self.manager.shutdown(wait=False)
            self.manager = None
