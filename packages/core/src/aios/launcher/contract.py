"""The launcher <-> worker contract: every ``AIOS_RUN_*`` environment variable in one place.

``aios-run`` (and the backends' and cloud providers' launchers) set these for the worker
processes; the runtime and the strategies read them. Names under :data:`CONTROL_PREFIX` are
reserved: they are never parsed as config keys (``AIOS_<SECTION>__<KEY>`` is config).

Import the constants; never spell the strings elsewhere. This module imports nothing heavy.
"""

from __future__ import annotations

#: prefix of every reserved launcher/worker variable
CONTROL_PREFIX = "AIOS_RUN_"

#: JSON of the config keys that were set (file, env, overrides, flags), secret-looking keys dropped
CONFIG_ENV = "AIOS_RUN_CONFIG"
#: the backend ``aios-run`` resolved (workers use it instead of ``backend: auto``)
BACKEND_ENV = "AIOS_RUN_BACKEND"
#: the run id: one per ``aios-run`` invocation, shared by every worker (run records, checkpoints)
RUN_ID_ENV = "AIOS_RUN_ID"
#: directory where each rank leaves ``rank<N>`` with ``preempted <checkpoint>`` after a preemption
STATUS_DIR_ENV = "AIOS_RUN_STATUS_DIR"
#: this host's index among the hosts of a multi-host launch (TPU pods: one launcher per host)
NODE_RANK_ENV = "AIOS_RUN_NODE_RANK"
#: number of hosts of a multi-host launch
NNODES_ENV = "AIOS_RUN_NNODES"
#: the local process index set by a backend's per-process launcher (XLA ``xmp.spawn``)
LOCAL_INDEX_ENV = "AIOS_RUN_LOCAL_INDEX"
#: the cloud provider that started this host (``aws``, ``gcp``), set on cloud hosts
CLOUD_ENV = "AIOS_RUN_CLOUD"
#: set on spot hosts: watch the provider's interruption notice (see the cloud plugins)
SPOT_WATCH_ENV = "AIOS_RUN_SPOT_WATCH"
#: pid of the ``aios-run`` process; workers end themselves when it dies (see :mod:`aios.launcher.worker`)
LAUNCHER_PID_ENV = "AIOS_RUN_LAUNCHER_PID"
#: the host name a worker reports in its errors (version checks); default: the machine's hostname
HOST_ENV = "AIOS_RUN_HOST"
#: set (to anything) to skip ``aios-run``'s pre-import of torch before spawning workers
NO_PREIMPORT_ENV = "AIOS_RUN_NO_PREIMPORT"
#: ``0`` starts every rank as a fresh interpreter instead of forking it from ``aios-run``'s
#: zygote (:mod:`aios.launcher.warm`; also ``launch.warm_start=false``)
WARM_START_ENV = "AIOS_RUN_WARM_START"

#: wall-clock time (``time.time()`` epoch seconds) by which this host will be gone, set by the
#: launcher when it knows one ahead (a Capacity Block's end minus the 30 minutes AWS reclaims
#: before it, a queued resource's ``--valid-until``, a Slurm job's end): every rank's
#: :class:`aios.resilience.notices.DeadlineWatcher` announces it in time for the emergency checkpoint
DEADLINE_ENV = "AIOS_RUN_DEADLINE"
#: the notice source name of :data:`DEADLINE_ENV` (``capacity-block``, ``queued-resource``,
#: ``slurm``; default ``deadline``)
DEADLINE_SOURCE_ENV = "AIOS_RUN_DEADLINE_SOURCE"
#: seconds the platform lets a process live after SIGTERM (GKE Spot: 15): caps
#: ``checkpoint.grace_seconds`` for the SIGTERM notice's deadline
GRACE_CAP_ENV = "AIOS_RUN_GRACE_CAP"
#: wall-clock time (epoch seconds) the launcher started this attempt (``aios-run``; cloud
#: launchers for their hosts): the start of the run record's start-up account (goodput)
LAUNCH_TIME_ENV = "AIOS_RUN_LAUNCH_TIME"

ALL = (
    CONFIG_ENV,
    BACKEND_ENV,
    RUN_ID_ENV,
    STATUS_DIR_ENV,
    NODE_RANK_ENV,
    NNODES_ENV,
    LOCAL_INDEX_ENV,
    CLOUD_ENV,
    SPOT_WATCH_ENV,
    NO_PREIMPORT_ENV,
    LAUNCHER_PID_ENV,
    HOST_ENV,
    DEADLINE_ENV,
    DEADLINE_SOURCE_ENV,
    GRACE_CAP_ENV,
    LAUNCH_TIME_ENV,
)
