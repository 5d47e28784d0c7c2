"""``aios launch``: its options, checked once into a :class:`~aios_cloud.request.LaunchRequest`."""

from __future__ import annotations

import sys
from typing import Any

import click

from aios_cloud.cli.common import CLOUD_HELP, _echo, _log, _printer
from aios_cloud.launch.flow import run
from aios_cloud.request import LaunchRequest

# ------------------------------------------------------------------------------ launch


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("script")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--cloud", help=CLOUD_HELP)
@click.option(
    "--accelerator",
    "-a",
    "--instance-type",
    "accelerator",
    help="Accelerator / instance type (v5litepod-8, v4-16, trn1.32xlarge), or candidates in order "
    "of preference (-a p5.48xlarge,trn1.32xlarge): the first with capacity is launched, and a "
    "managed recovery that finds none for the current type moves to the next.",
)
@click.option(
    "--cheapest",
    is_flag=True,
    help="Order the candidates of -a by the catalog's hourly price (spot with --spot).",
)
@click.option("--name", "-n", help="Cluster name (reused when it exists). Default: aios-USER-XXXX.")
@click.option("--zone", help="Zone to try first.")
@click.option("--region", help="Region (clouds that are regional).")
@click.option("--nodes", type=int, default=1, show_default=True, help="Slices / instances.")
@click.option("--spot", is_flag=True, help="Spot / preemptible capacity.")
@click.option(
    "--max-restarts",
    type=int,
    default=0,
    show_default=True,
    help="Managed run: recover this many times from preemption or failure of the hosts.",
)
@click.option(
    "--queued",
    is_flag=True,
    help="Wait for capacity through a queued resource instead of failing on a stockout.",
)
@click.option("--valid-after", help="Queued: earliest start (RFC 3339 or +2h).")
@click.option("--valid-until", help="Queued: give up if not provisioned by then (RFC 3339 or +6h).")
@click.option("--image", help="Runtime version / image (default: per accelerator generation).")
@click.option("--disk-gb", type=int, help="Boot disk size.")
@click.option("--label", multiple=True, help="Label key=value on every resource.")
@click.option("--project", help="Cloud project (GCP).")
@click.option(
    "--backend", help="aios backend on the hosts (default: the accelerator's: xla, neuron, cuda)."
)
@click.option(
    "--checkpoint-dir",
    help="Bucket URL for checkpoints (gs://..., s3://...); required for --max-restarts.",
)
@click.option("--workdir", default=".", show_default=True, help="Directory synced to the hosts.")
@click.option(
    "--exclude",
    multiple=True,
    help="Extra glob excluded from code sync (data/.git/checkpoints always are).",
)
@click.option("--max-sync-mb", type=int, default=512, show_default=True)
@click.option("--requirements", type=click.Path(), help="requirements.txt installed by setup.")
@click.option(
    "--setup-script",
    type=click.Path(),
    help="Replace the default setup (pinned torch/torch_xla/libtpu) with this shell script.",
)
@click.option("--no-setup", is_flag=True, help="Skip setup (image already has everything).")
@click.option(
    "--no-bundle",
    is_flag=True,
    help="Do not ship this aios to the hosts (their image has it installed).",
)
@click.option(
    "--python",
    "python",
    default=None,
    help="Interpreter on the hosts (default: the provider's, e.g. the DLAMI's torch venv on AWS, python3 on TPU VMs).",
)
@click.option(
    "--env",
    "env_items",
    multiple=True,
    help="NAME=VALUE, or NAME to forward its value from here (secrets).",
)
@click.option(
    "--ssh-key",
    "--identity",
    "ssh_key",
    help="Private key (default: aios's own key in the aios home; --cloud ssh: your SSH setup).",
)
@click.option(
    "--hosts",
    help="--cloud ssh: your hosts, USER@HOST[:PORT][/WORKER_PORT],... (worker 0 first; node "
    "ranks follow the list; /WORKER_PORT: that host's own sshd port as the other hosts reach it).",
)
@click.option(
    "--hosts-file",
    type=click.Path(dir_okay=False),
    help="--cloud ssh: a file with one USER@HOST[:PORT][/WORKER_PORT] a line (# comments).",
)
@click.option(
    "--nprocs-per-host",
    type=int,
    help="--cloud ssh: processes per host (default: the accelerators found on each, else 1).",
)
@click.option(
    "--network", help="--cloud ssh: the hosts' own network (CIDR) for the master address."
)
@click.option(
    "--worker-port",
    type=click.IntRange(1, 65535),
    help="--cloud ssh: the sshd port the hosts reach each other at on their own network "
    "(default 22; the port in USER@HOST:PORT is how this machine reaches them, e.g. a NAT "
    "gateway's forward; HOST:PORT/WORKER_PORT sets it for one host).",
)
@click.option(
    "--host-wait",
    type=float,
    help="--cloud ssh: seconds a managed restart waits for every host to answer again (default "
    "120; a launch waits at most 30).",
)
@click.option(
    "--min-hosts",
    type=int,
    help="--cloud ssh, managed: continue on the hosts that answer when at least this many do "
    "(default: all), and grow back to every host at the next checkpoint when they return.",
)
@click.option("--ssh-user", default=None, help="Login user on the hosts.")
@click.option("--no-failover", is_flag=True, help="Do not move to other zones on a stockout.")
@click.option("--module", "-m", is_flag=True, help="SCRIPT is a module (python -m).")
@click.option(
    "--detach",
    "-d",
    is_flag=True,
    help="Return after the job starts; a background watcher keeps managing it.",
)
@click.option("--down", "down_after", is_flag=True, help="Delete the cluster when the job ends.")
@click.option(
    "--autostop",
    "autostop",
    type=float,
    default=None,
    help="Minutes without a running job after which an agent ON the head host stops the cluster "
    "(survives this laptop).",
)
@click.option(
    "--autodown", is_flag=True, help="With --autostop: delete the cluster instead of stopping it."
)
@click.option(
    "--controller",
    help="USER@HOST[:PORT]: run the managed job's recovery loop (and --down) there, detached, so "
    "it survives this machine.",
)
@click.option(
    "--controller-python", help="Interpreter on the controller host (default: this one's path)."
)
@click.option(
    "--reservation",
    help="Reserved capacity: GCP reservation name, AWS capacity reservation (cr-...) or capacity block id.",
)
@click.option(
    "--poll", type=float, default=5.0, show_default=True, help="Watcher poll interval in seconds."
)
@click.option(
    "--max-cost",
    metavar="USD",
    help="Spending limit: before the job's projected spend (the catalog's price x hosts x time) "
    "passes it, the job is checkpointed and stopped (exit 75; with --down the cluster is "
    "deleted). Needs a cloud with prices.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the equivalent cloud CLI and per-worker commands; touch nothing.",
)
@click.option("--config", "config_file", help="aios config YAML.")
def launch(**options: Any) -> None:
    """Provision cloud machines and run SCRIPT on every host.

    \b
    aios launch --cloud gcp -a v5litepod-8 --spot --zone us-west4-a train.py -- --epochs 3
    aios launch -a v4-16 --spot --max-restarts 3 --checkpoint-dir gs://b/ckpt train.py
    """
    request = LaunchRequest.from_options(options)
    sys.exit(run(request, _echo, _log, _printer()))
