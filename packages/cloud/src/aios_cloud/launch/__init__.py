"""``aios launch`` as named stages, driven by a checked :class:`~aios_cloud.request.LaunchRequest`
(the CLI only parses options into the request and prints):

1. :func:`plan` (:mod:`~aios_cloud.launch.planning`): resolve the cloud and the provider, then
   check everything against them (the accelerator, the cluster request the provider validates,
   setup, checkpoints) and build the :class:`~aios_cloud.request.JobSpec`; a batch scheduler
   (Slurm, Kubernetes) gets the request instead
   (:meth:`~aios_cloud.provider.SchedulerProvider.launch_job`);
2. :func:`render` (:mod:`~aios_cloud.launch.dryrun`, ``--dry-run``): the provider renders the
   path the launch takes, with the prices (:mod:`~aios_cloud.launch.pricing`), and stops;
3. :func:`prepare`: credentials, the autostop agent's rights, the checkpoint bucket, the SSH key:
   before anything is billed;
4. :func:`provision`: create the cluster (zone failover) or reuse the recorded one;
5. :func:`sync`, :func:`setup`, :func:`start`: the code through worker 0, the setup, the job on
   every host (and the autostop agent);
6. :func:`cleanup` when any of 4-5 failed: the cluster this launch created is deleted, a job it
   started on a reused one is stopped (3-6 in :mod:`~aios_cloud.launch.stages`);
7. :func:`watch` (:mod:`~aios_cloud.launch.follow`): follow the job (or hand it to a controller
   host / a background watcher) and delete the cluster after it with ``--down``.

:func:`run` (:mod:`~aios_cloud.launch.flow`) drives them in order; :class:`Launch`
(:mod:`~aios_cloud.launch.context`) is the state they pass on, and
:mod:`~aios_cloud.launch.checks` holds the launch's own checks. SkyPilot's
``sky/execution.py`` stages its launch the same way.
"""

from __future__ import annotations

from aios_cloud.launch.checks import check_autostop, check_bucket, check_checkpoints
from aios_cloud.launch.context import Launch
from aios_cloud.launch.dryrun import render
from aios_cloud.launch.flow import run
from aios_cloud.launch.follow import watch
from aios_cloud.launch.planning import cluster_request, job_spec, plan
from aios_cloud.launch.stages import add_job, cleanup, prepare, provision, setup, start, sync

__all__ = [
    "Launch",
    "add_job",
    "check_autostop",
    "check_bucket",
    "check_checkpoints",
    "cleanup",
    "cluster_request",
    "job_spec",
    "plan",
    "prepare",
    "provision",
    "render",
    "run",
    "setup",
    "start",
    "sync",
    "watch",
]
