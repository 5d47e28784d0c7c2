"""The hosts of ``--cloud ssh``: ``--hosts``/``--hosts-file`` entries parsed and checked,
the accelerators a host may be asked for, and the cluster's hosts as its record keeps them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aios.errors import AiosError

from aios_cloud.provider.data import ClusterHost, ClusterRequest
from aios_cloud.store import Store

ZONE = "your-hosts"


# -a value -> (backend, what the probe counts for it)
ACCELERATORS = {
    "auto": ("cpu", ""),
    "cpu": ("cpu", ""),
    "gpu": ("cuda", "gpus"),
    "tpu": ("tpu", "tpu"),
    "trainium": ("neuron", "neuron"),
}


STACK = {"cuda": "cuda", "neuron": "neuron", "tpu": "torch_tpu", "xla": "torch_xla"}


DEFAULT_HOST_WAIT = 120.0


_HOST_RE = re.compile(
    r"^(?:(?P<user>[A-Za-z_][A-Za-z0-9_.-]*)@)?"
    r"(?P<host>[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?)"
    r"(?::(?P<port>[^:@/]*))?"
    r"(?:/(?P<worker_port>[^:@/]*))?$"
)


# ------------------------------------------------------------------------------ host lists


@dataclass(frozen=True)
class HostSpec:
    """One entry of the host list: ``[USER@]HOST[:PORT][/WORKER_PORT]``. ``user`` ``""`` and
    ``port`` ``0``: not given, so ``ssh`` takes them from ``~/.ssh/config`` (or its own
    defaults): aios never passes ``-p``/``user@`` the user did not write, since the command line
    wins over the config file (ssh_config(5)). ``worker_port``: the port the *other hosts* reach
    this one's sshd at on their shared network (``root@gw:2201/2222``: this machine goes through
    the gateway's 2201, the other hosts to port 2222 inside); ``0``: ``--worker-port``, else
    22."""

    user: str
    host: str
    port: int = 0
    worker_port: int = 0

    @property
    def target(self) -> str:
        """What ``ssh`` is given (never the worker port: that is the other hosts' way in)."""
        return (
            (f"{self.user}@" if self.user else "")
            + self.host
            + (f":{self.port}" if self.port else "")
        )

    @property
    def entry(self) -> str:
        """The entry as recorded with the cluster (parsed back by :func:`parse_hosts`)."""
        return self.target + (f"/{self.worker_port}" if self.worker_port else "")


def parse_hosts(items: list[str], default_user: str, where: str = "--hosts") -> list[HostSpec]:
    """Parse ``[USER@]HOST[:PORT][/WORKER_PORT]`` entries; every problem is one line (exit 2)
    naming the entry."""
    out: list[HostSpec] = []
    seen: dict[tuple[str, int], str] = {}
    for raw in items:
        item = raw.strip()
        m = _HOST_RE.match(item)
        if not m:
            raise AiosError(
                f"{where}: '{item}' is not USER@HOST[:PORT][/WORKER_PORT]",
                "write each host as e.g. ubuntu@10.0.0.5, ubuntu@gpu-box:2222 or root@gw:2201/22",
            )
        port = _port(m.group("port"), item, where, "has port", "ubuntu@10.0.0.5:2222")
        worker_port = _port(
            m.group("worker_port"), item, where, "has worker port", "root@gw:2201/22"
        )
        spec = HostSpec(m.group("user") or default_user, m.group("host"), port, worker_port)
        key = (spec.host.lower(), spec.port or 22)
        if key in seen:
            raise AiosError(
                f"{where}: host {key[0]}:{spec.port} is listed twice ('{seen[key]}' and '{item}')",
                "list every machine once",
            )
        seen[key] = item
        out.append(spec)
    if not out:
        raise AiosError(f"{where}: no hosts given", "list at least one USER@HOST[:PORT]")
    return out


def _port(text: str | None, item: str, where: str, what: str, example: str) -> int:
    """A port written in a host entry (0: none written); one line when it is not 1-65535."""
    if text is None:
        return 0
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise AiosError(
            f"{where}: '{item}' {what} '{text}', not a number from 1 to 65535",
            f"write it as a port number, e.g. {example}",
        )
    return int(text)


def read_hosts_file(path: str) -> list[str]:
    """The entries of a hosts file: one host a line; blank lines and ``#`` comments ignored."""
    try:
        text = Path(path).expanduser().read_text()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not text"
        raise AiosError(
            f"--hosts-file {path} cannot be read ({why})",
            "pass a readable text file with one USER@HOST[:PORT] a line",
        ) from None
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(line)
    if not out:
        raise AiosError(f"--hosts-file {path} lists no hosts", "write one USER@HOST[:PORT] a line")
    return out


def split_hosts(text: str) -> list[str]:
    """``a,b c`` -> entries (commas and whitespace separate; an empty entry is an error)."""
    if not text.strip():
        return []
    parts = [p.strip() for p in text.split(",")]
    if "" in parts:
        raise AiosError(f"--hosts '{text}' has an empty entry", "separate hosts with single commas")
    return [entry for p in parts for entry in p.split()]


# ------------------------------------------------------------------------------ the provider


@dataclass
class SshHost(ClusterHost):
    """A user's host as the cluster record keeps it: ``nprocs`` (processes the launch plan
    starts there) and ``devices`` (what the probe found) besides :class:`ClusterHost`'s fields."""

    nprocs: int = 1
    devices: str = ""


def host_specs(request: ClusterRequest | dict[str, Any]) -> list[HostSpec]:
    extra = request.extra if isinstance(request, ClusterRequest) else request.get("extra", {})
    return parse_hosts(list(extra.get("hosts") or []), "")


def cluster_hosts(specs: list[HostSpec], key: str | None) -> list[ClusterHost]:
    return [
        ClusterHost(
            i,
            s.host,
            None,
            ssh_user=s.user,
            ssh_key=key,
            port=s.port,
            internal_port=s.worker_port or None,
        )
        for i, s in enumerate(specs)
    ]


def cluster_record(name: str) -> Any:
    return Store().get_cluster(name)
