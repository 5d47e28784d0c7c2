"""Per-step fault tolerance with torchft replica groups (``ft.replica_groups=G``).

``aios-run --nprocs N ft.replica_groups=G train.py`` runs G replica groups of N/G processes.
Inside a group the configured strategy runs as without groups; across groups the gradients are
averaged by torchft's manager (its fault-tolerant all-reduce), and each step commits with the
groups in that step's quorum:

* :mod:`aios.ft.plan`: the refusals before any rank starts (torchft missing, a backend torchft
  does not cover, nprocs not divisible by G) and the environment handed to the ranks;
* :mod:`aios.ft.launch`: ``aios-run``'s side: the lighthouse (started and stopped by aios-run,
  bound to the run's interface only, on a free port), the groups' processes, and the restart of
  a lost group alone (the other groups never restart). Over several hosts (``--nnodes H``, one
  aios-run per host, G a multiple of H) each host runs G/H groups; node 0's aios-run starts the
  lighthouse and a store on ``master_addr:master_port`` through which the other hosts find it;
* :mod:`aios.ft.replica`: a rank's side: the manager of its group, the step protocol (quorum at
  the step's start, the all-reduce of the gradients across groups, the commit vote at its end)
  and the heal of a restarted group from a live peer over torchft's HTTP checkpoint transport;
* :mod:`aios.ft.data`: the data stays global: each step's batches are split over the groups in
  the step's quorum, counted in committed samples; a step that did not commit is trained again.

torchft 0.2.0 (the extra ``aios-core[ft]``): aios calls the manager's ``allreduce`` and
``should_commit`` itself; 0.2.0's ``DistributedDataParallel`` wrapper crashed the survivor when
its peer died inside the all-reduce, so it is not used.
"""

from __future__ import annotations

import os

#: environment handed to each rank of a replica group by aios-run
GROUP_ENV = "AIOS_FT_GROUP"
GROUPS_ENV = "AIOS_FT_GROUPS"
LIGHTHOUSE_ENV = "AIOS_FT_LIGHTHOUSE"
STORE_PORT_ENV = "AIOS_FT_STORE_PORT"
STATE_DIR_ENV = "AIOS_FT_STATE_DIR"
RESTARTED_AT_ENV = "AIOS_FT_RESTARTED_AT"
#: ``host:port`` of the run's store on node 0 when the groups span hosts (``nnodes > 1``): the
#: first quorum's barrier across hosts and the groups that ended (:mod:`aios.ft.replica`)
RUN_STORE_ENV = "AIOS_FT_RUN_STORE"
#: the keys of that store
LIGHTHOUSE_KEY = "aios/ft/lighthouse"
#: what a group's process is handed besides a rank's usual variables, all read when used (by
#: :mod:`aios.ft.replica` as the manager starts; ``RUST_LOG`` by torchft's own import, which the
#: zygote never makes): a group's process may be forked warm with them (:mod:`aios.launcher.warm`)
RANK_RUNTIME_VARS = frozenset(
    {
        GROUP_ENV,
        GROUPS_ENV,
        LIGHTHOUSE_ENV,
        STORE_PORT_ENV,
        STATE_DIR_ENV,
        RESTARTED_AT_ENV,
        RUN_STORE_ENV,
        "RUST_LOG",
    }
)


def ready_key(group: int, rank: int) -> str:
    """Set by rank ``rank`` of ``group`` once its manager is up (the first quorum's barrier)."""
    return f"aios/ft/ready/{group}/{rank}"


def ready_path(state_dir: str, group: int, rank: int) -> str:
    """On one host: the file rank ``rank`` of ``group`` writes in aios-run's state folder once
    its manager is up (the first quorum's barrier; removed when the group is restarted)."""
    return os.path.join(state_dir, f"group{group}.r{rank}.ready")


def done_key(group: int) -> str:
    """Set by the group's aios-run when the group ended its training (exit 0)."""
    return f"aios/ft/done/{group}"


def beat_key(group: int) -> str:
    """The step group ``group`` last asked a quorum from (its ranks' latest, as its host's
    aios-run last read them; empty once the group was lost or before it asked): what the hang
    watch of the other hosts compares their groups with (:mod:`aios.ft.hang`)."""
    return f"aios/ft/beat/{group}"


def ended_key(node: int) -> str:
    """Set by node ``node``'s aios-run when its groups have ended (node 0's waits for them: its
    lighthouse serves every host's groups)."""
    return f"aios/ft/ended/{node}"
