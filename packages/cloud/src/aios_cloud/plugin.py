"""The ``aios-cloud`` plugin (entry point): contributes the cloud commands to the ``aios`` CLI,
and the ``ssh`` cloud (hosts the user already has, :mod:`aios_cloud.sshhosts`).

Imports nothing of the control plane: each command is named by ``module:attribute`` and imported
only when it runs, so ``aios --help`` stays fast and imports no torch.
"""

from __future__ import annotations

from typing import Any

from aios.plugins.hookspecs import hookimpl
from aios.types import CloudSpec, CommandSpec, Lazy

# name -> (module:attribute, one-line help): one module of aios_cloud.cli per command group
COMMANDS: dict[str, tuple[str, str]] = {
    "launch": (
        "aios_cloud.cli.launch:launch",
        "Provision cloud machines and run a script on them.",
    ),
    "status": (
        "aios_cloud.cli.status:status",
        "Clusters and jobs with their state and recoveries.",
    ),
    "exec": ("aios_cloud.cli.remote:exec_", "Run a command on every host of a cluster."),
    "logs": ("aios_cloud.cli.remote:logs", "Show a cluster's job logs."),
    "ssh": ("aios_cloud.cli.remote:ssh", "Open a shell on one host of a cluster."),
    "sync": ("aios_cloud.cli.sync:sync", "Copy files between local paths, clusters and buckets."),
    "stop": ("aios_cloud.cli.lifecycle:stop", "Stop a cluster (keeps its disks)."),
    "start": ("aios_cloud.cli.lifecycle:start", "Start a stopped cluster."),
    "cancel": (
        "aios_cloud.cli.lifecycle:cancel",
        "Cancel a cluster's running job (scancel on Slurm).",
    ),
    "down": (
        "aios_cloud.cli.lifecycle:down",
        "Delete a cluster and everything aios created for it.",
    ),
    "autostop": (
        "aios_cloud.cli.lifecycle:autostop",
        "Stop or delete a cluster when it has been idle (agent on the cluster).",
    ),
    "catalog": (
        "aios_cloud.cli.prices:catalog",
        "Accelerators offered by the installed clouds, with prices.",
    ),
    "cost": ("aios_cloud.cli.prices:cost", "Estimate or rank the cost of a run across clouds."),
}


@hookimpl
def aios_register_commands(register: Any) -> None:
    for name, (target, help_) in COMMANDS.items():
        register(CommandSpec(name=name, target=target, help=help_))


@hookimpl
def aios_register_clouds(register: Any) -> None:
    register(
        CloudSpec(
            name="ssh",
            factory=Lazy("aios_cloud.sshhosts.provider:SshHostsProvider"),
            description="hosts you already have, over SSH (--hosts USER@HOST[:PORT],...)",
            install_hint="pip install -e ./packages/cloud",
        )
    )


@hookimpl
def aios_report_target(target: str) -> str | None:
    """``aios report CLUSTER``: the newest run record of the cluster's newest job, copied from
    its hosts (:func:`aios_cloud.runs.report_target`)."""
    # deferred: the control plane (store, ssh, the registry) loads when a report is asked for
    from aios_cloud.runs import report_target

    return report_target(target)
