"""The ``slurm`` config section (``AIOS_SLURM__PARTITION=gpu``, YAML ``slurm:``)."""

from __future__ import annotations

from aios.config.settings import Section
from pydantic import Field


class SlurmSettings(Section):
    login: str | None = Field(
        None, description="ssh destination of a login node (user@host); None: the local sbatch"
    )
    ssh_key: str | None = Field(None, description="private key for the login node (path)")
    ssh_port: int = Field(22, ge=1, le=65535)
    ssh_options: list[str] = Field(
        default_factory=list,
        description="extra ssh -o options (StrictHostKeyChecking=..., UserKnownHostsFile=...)",
    )
    login_env: dict[str, str] = Field(
        default_factory=dict,
        description="variables exported before every Slurm command on the login node (SLURM_CONF, PATH); no secrets",
    )
    remote_dir: str = Field(
        "~/aios-slurm",
        description="directory on a filesystem every node mounts; code, scripts, logs go to <remote_dir>/<name>",
    )
    partition: str | None = Field(
        None, description="default partition (else -a/--zone, else the cluster's default)"
    )
    account: str | None = Field(None, description="#SBATCH --account")
    qos: str | None = Field(None, description="#SBATCH --qos")
    time: str | None = Field(
        None,
        description="#SBATCH --time, quoted in YAML ('02:00:00', '1-00:00:00'; an unquoted 2:00:00 is a YAML number)",
    )
    ntasks_per_node: int = Field(
        1, ge=1, description="tasks per node; 1: aios-run starts one process per device itself"
    )
    gpus_per_node: int | None = Field(
        None,
        ge=0,
        description="GPUs per node the job asks for (#SBATCH --gpus-per-node, or --gres=gpu:N "
        "where the cluster's SelectType is not select/cons_tres); None: every GPU of a node of the "
        "partition when the backend is cuda, none otherwise; 0: none",
    )
    gpus_per_task: int | None = Field(
        None,
        ge=0,
        description="#SBATCH --gpus-per-task, instead of the per-node request (with ntasks_per_node > 1)",
    )
    cpus_per_task: int | None = Field(
        None,
        ge=1,
        description="#SBATCH --cpus-per-task, passed on to srun; None: the node's CPUs in the share "
        "of its GPUs the job asks for (all of them on a CPU partition, or with exclusive), "
        "divided among ntasks_per_node",
    )
    exclusive: bool = Field(
        False, description="#SBATCH --exclusive: whole nodes, every CPU of them for the tasks"
    )
    mem: str | None = Field(None, description="#SBATCH --mem (e.g. 64G)")
    constraint: str | None = Field(None, description="#SBATCH --constraint")
    signal_grace: int = Field(
        120,
        ge=5,
        description="seconds before the time limit the batch shell gets SIGTERM (routed to the emergency checkpoint)",
    )
    sbatch_args: list[str] = Field(
        default_factory=list, description="extra #SBATCH lines (e.g. --mail-type=END)"
    )
    setup: list[str] = Field(
        default_factory=list,
        description="shell lines run in the batch script before srun (module load ...)",
    )
    python: str = Field(
        "python3",
        description="interpreter on the nodes (must have aios' dependencies: pluggy, click, pydantic, torch)",
    )
    poll_interval: float = Field(
        5.0, gt=0, description="seconds between squeue/scontrol polls while following a job"
    )
