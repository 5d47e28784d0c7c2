"""``aios launch --cloud ssh``'s host options, checked once (one line, exit 2)."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

from aios.errors import AiosError

from aios_cloud.request import LaunchRequest
from aios_cloud.sshhosts.hosts import (
    DEFAULT_HOST_WAIT,
    cluster_record,
    parse_hosts,
    read_hosts_file,
    split_hosts,
)
from aios_cloud.sshhosts.shell import VENV_PYTHON


def host_python(request: LaunchRequest, current: str) -> str:
    """The interpreter on the hosts: ``--python`` as given, else aios's own environment (unless
    ``--no-setup``), else ``current``."""
    if request.python:
        return request.python  # the user's interpreter, used as it is
    if not request.no_setup:
        # aios's own virtual environment on every host (created by setup, removed by
        # `aios down`): never an install into a system interpreter (PEP 668 refuses it on
        # Debian 12 / Ubuntu 24.04, and it would change the user's machine)
        return VENV_PYTHON
    return current


def launch_options(request: LaunchRequest, existing: bool, python: str) -> dict[str, Any]:
    """Check ``aios launch``'s host options (one line, exit 2) and return what the cluster
    request carries: the host list and how to use it (no secrets: the key is a path)."""
    n = request.nprocs_per_host
    if n is not None and n < 1:
        raise AiosError(
            f"--nprocs-per-host must be at least 1, got {n}", "pass e.g. --nprocs-per-host 2"
        )
    wait = request.host_wait
    if wait is not None and wait < 0:
        raise AiosError(
            f"--host-wait must be 0 or more seconds, got {wait:g}", "pass e.g. --host-wait 120"
        )
    network = request.network
    if network:
        try:
            network = str(ipaddress.IPv4Network(network, strict=False))
        except ValueError:
            raise AiosError(
                f"--network '{network}' is not an IPv4 network", "write it as e.g. 10.0.0.0/24"
            ) from None
    hosts_opt, hosts_file = request.hosts, request.hosts_file
    if hosts_opt is not None and hosts_file:
        raise AiosError("--hosts and --hosts-file both list hosts", "pass only one")
    if hosts_opt is None and not hosts_file:
        if existing:
            return {}
        raise AiosError(
            "--cloud ssh needs the hosts to run on",
            "pass --hosts USER@HOST[:PORT],... or --hosts-file FILE",
        )
    entries = read_hosts_file(hosts_file) if hosts_file else split_hosts(hosts_opt or "")
    default_user = request.ssh_user or ""  # unset: ~/.ssh/config (or ssh) decides
    specs = parse_hosts(entries, default_user, "--hosts-file" if hosts_file else "--hosts")
    ckpt = request.checkpoint_dir
    managed = request.managed
    if managed and ckpt and "://" not in ckpt and not ckpt.startswith("/"):
        raise AiosError(
            f"--checkpoint-dir {ckpt} is relative: each host would resolve it on its own disk",
            "pass an absolute path on a filesystem every host mounts (NFS), or a bucket URL",
        )
    if request.min_hosts is not None and request.min_hosts > len(specs):
        raise AiosError(
            f"--min-hosts {request.min_hosts} is more than the {len(specs)} hosts listed",
            f"pass --min-hosts {len(specs)} or less",
        )
    extra = {
        "hosts": [s.entry for s in specs],
        "min_hosts": request.min_hosts,
        "identity": str(Path(request.ssh_key).expanduser()) if request.ssh_key else None,
        "nprocs_per_host": n,
        "network": network,
        # the hosts' own sshd port between themselves (behind NAT / port forwards the port
        # in USER@HOST:PORT is the gateway's); an entry's /WORKER_PORT wins for its host
        "worker_port": request.worker_port or 22,
        "host_wait": DEFAULT_HOST_WAIT if wait is None else float(wait),
        "python": python,
        "shared_checkpoint_dir": ckpt if managed and ckpt and "://" not in ckpt else None,
    }
    if existing:
        # a launch on an existing cluster uses its recorded hosts and plan: a different one
        # asked for here would be ignored silently, so it is refused
        name = request.name or ""
        rec = cluster_record(name)
        old = (rec.request.get("extra") or {}) if rec is not None else {}
        given = {
            "hosts": True,
            "identity": bool(request.ssh_key),
            "nprocs_per_host": n is not None,
            "network": bool(network),
            "host_wait": wait is not None,
        }
        differ = [
            "--" + key.replace("_", "-")
            for key, asked in given.items()
            if asked and old.get(key) != extra[key]
        ]
        if differ:
            raise AiosError(
                f"cluster {name} exists with other {', '.join(differ)}",
                f"launch it as it is (leave out --hosts), or `aios down {name}` and launch again",
            )
        return {}
    return extra
