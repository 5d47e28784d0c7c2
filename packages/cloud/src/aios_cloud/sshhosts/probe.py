"""Reaching a host read-only: the probe command run there (addresses, devices, python and
torch, aios jobs already running) and the address the other hosts reach it at."""

from __future__ import annotations

import ipaddress
import shlex
import socket
from dataclasses import dataclass, field

from aios.devices.pci import tpu_count_shell

from aios_cloud.provider.errors import CloudError

# ------------------------------------------------------------------------------ the probe


def probe_command(cluster: str, python: str) -> str:
    """What aios runs on every host to reach and inspect it (read only)."""
    py = shlex.quote(python)
    return "; ".join(
        [
            'echo "hostname=$(hostname)"',
            "(ip -o -4 addr show scope global 2>/dev/null | awk '{print \"addr=\" $4}')",
            'echo "cpus=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)"',
            "echo \"gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')\"",
            'echo "gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)"',
            'echo "neuron=$(ls -d /dev/neuron[0-9]* 2>/dev/null | wc -l)"',
            # TPU chips by vendor AND device id (aios.devices.pci, the table backend-xla's discovery
            # uses): gVNIC has Google's vendor id too
            f'echo "tpu=$({tpu_count_shell()})"',
            f'echo "python=$({py} -c "import sys; print(\'%d.%d.%d\' % sys.version_info[:3])" 2>/dev/null)"',
            f'echo "torch=$({py} -c "import importlib.metadata as m; print(m.version(\'torch\'))" 2>/dev/null)"',
            f'for p in "$HOME"/aios/{cluster}/jobs/*/pid; do [ -f "$p" ] || continue; '
            f'd="${{p%/pid}}"; [ -f "$d/exit_code" ] && continue; '
            'kill -0 "$(cat "$p")" 2>/dev/null && echo "busy=${d##*/}"; done',
            "true",
        ]
    )


@dataclass
class Probe:
    hostname: str = ""
    addrs: list[ipaddress.IPv4Interface] = field(default_factory=list)
    cpus: int = 0
    gpus: int = 0
    gpu_name: str = ""
    neuron: int = 0
    tpu: int = 0
    python: str = ""
    torch: str = ""
    busy: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, lines: list[str]) -> Probe:
        p = cls()
        for line in lines:
            key, eq, value = line.strip().partition("=")
            if not eq:
                continue
            if key == "addr":
                try:
                    p.addrs.append(ipaddress.IPv4Interface(value))
                except ValueError:
                    continue
            elif key == "busy":
                p.busy.append(value)
            elif key in ("cpus", "gpus", "neuron", "tpu"):
                setattr(p, key, int(value) if value.strip().isdigit() else 0)
            elif key in ("hostname", "gpu_name", "python", "torch"):
                setattr(p, key, value.strip())
        return p

    def devices(self) -> str:
        found = []
        if self.gpus:
            found.append(f"{self.gpus} x {self.gpu_name or 'NVIDIA GPU'}")
        if self.tpu:
            found.append(f"{self.tpu} TPU chips")
        if self.neuron:
            found.append(f"{self.neuron} Neuron devices")
        return ", ".join(found) or f"{self.cpus} CPUs"

    def count(self, kind: str) -> int:
        return int(getattr(self, kind)) if kind else 0


def internal_addresses(
    probes: list[Probe], ssh_addresses: list[str | None], network: str | None = None
) -> tuple[list[str | None], str]:
    """The address each host has on the network the hosts share (worker 0's is the master
    address), and how it was chosen. ``ssh_addresses``: each host's address as this machine
    reaches it (``None`` when it is a name that did not resolve).

    With ``network`` (a CIDR) every host must have an address in it. Otherwise: a subnet of
    worker 0 in which every other host has its own, distinct address (the subnet of worker 0's
    SSH address first; identical addresses, e.g. every host's ``docker0`` 172.17.0.1, are not a
    network); ``[None, ...]`` when there is none (the caller falls back to the SSH addresses).
    """
    if network:
        net = ipaddress.IPv4Network(network, strict=False)
        out: list[str | None] = []
        for i, p in enumerate(probes):
            inside = [a for a in p.addrs if a.ip in net]
            if not inside:
                have = ", ".join(str(a) for a in p.addrs) or "none"
                raise CloudError(
                    f"worker {i} has no address in --network {net} (its addresses: {have})",
                    "pass the network the hosts share, or leave --network out",
                )
            out.append(str(inside[0].ip))
        return out, f"in --network {net}"
    if len(probes) == 1:
        return [ssh_addresses[0] or (str(probes[0].addrs[0].ip) if probes[0].addrs else None)], ""
    head = probes[0]
    first = ssh_addresses[0]
    ordered = sorted(head.addrs, key=lambda a: str(a.ip) != first)
    for iface in ordered:
        net = iface.network
        if net.prefixlen >= 31:
            continue
        chosen = [str(iface.ip)]
        for p in probes[1:]:
            match = next((a for a in p.addrs if a.ip in net and str(a.ip) not in chosen), None)
            if match is None:
                break
            chosen.append(str(match.ip))
        else:
            return list(chosen), f"on {net}"
    return [None] * len(probes), ""


def resolve_address(host: str) -> str | None:
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET)
    except OSError:
        return None
    return str(infos[0][4][0]) if infos else None
