"""The ``aios-cloud`` plugin (entry point): contributes the cloud commands to the ``aios`` CLI,
and the ``ssh`` cloud (hosts the user already has, :mod:`aios_cloud.sshhosts`).

Imports nothing of the control plane: each command is named by ``module:attribute`` and imported
only when it runs, so ``aios --help`` stays fast and imports no torch.
"""

from __future__ import annotations

from typing import Any

from aios.plugins.hookspecs import hookimpl
from aios.types import CloudSpec, CommandSpec

CLI = "aios_cloud.cli"

# name -> (attribute in aios_cloud.cli, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "launch": ("launch", "Provision cloud machines and run a script on them."),
    "status": ("status", "Clusters and jobs with their state and recoveries."),
    "exec": ("exec_", "Run a command on every host of a cluster."),
    "logs": ("logs", "Show a cluster's job logs."),
    "ssh": ("ssh", "Open a shell on one host of a cluster."),
    "sync": ("sync", "Copy files between local paths, clusters and buckets."),
    "stop": ("stop", "Stop a cluster (keeps its disks)."),
    "start": ("start", "Start a stopped cluster."),
    "cancel": ("cancel", "Cancel a cluster's running job (scancel on Slurm)."),
    "down": ("down", "Delete a cluster and everything aios created for it."),
    "autostop": (
        "autostop",
        "Stop or delete a cluster when it has been idle (agent on the cluster).",
    ),
    "catalog": ("catalog", "Accelerators offered by the installed clouds, with prices."),
    "cost": ("cost", "Estimate or rank the cost of a run across clouds."),
}


@hookimpl
def aios_register_commands(register: Any) -> None:
    for name, (attr, help_) in COMMANDS.items():
        register(CommandSpec(name=name, target=f"{CLI}:{attr}", help=help_))


def _ssh_factory(config: Any = None) -> Any:
    from aios_cloud.sshhosts import SshHostsProvider

    return SshHostsProvider(config)


@hookimpl
def aios_register_clouds(register: Any) -> None:
    register(
        CloudSpec(
            name="ssh",
            factory=_ssh_factory,
            description="hosts you already have, over SSH (--hosts USER@HOST[:PORT],...)",
            install_hint="pip install -e ./packages/cloud",
        )
    )


@hookimpl
def aios_report_target(target: str) -> str | None:
    """``aios report CLUSTER``: the newest run record of the cluster's newest job, copied from
    its hosts (:func:`aios_cloud.runs.report_target`)."""
    from aios_cloud.runs import report_target

    return report_target(target)
