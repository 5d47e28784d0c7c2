"""``--cloud ssh``: hosts the user already has (lab machines, a GPU box, a TPU VM created by hand).

``aios launch --cloud ssh --hosts USER@HOST[:PORT],... [--identity KEY] train.py`` (or
``--hosts-file FILE``: one host a line, ``#`` comments) runs the whole launch flow of
:mod:`aios_cloud.launch` on them. Nothing is provisioned: "create" is reaching and inspecting the
hosts; "delete" and "stop" only end aios's own processes and remove aios's own files there. The
machines themselves are never stopped, rebooted or deleted.

* **Reach and inspect** (:data:`PROBE`, one SSH command per host, nothing installed): its
  addresses (``ip -o -4 addr``), CPU count, NVIDIA GPUs (``nvidia-smi -L``), Neuron devices
  (``/dev/neuron*``), TPU chips (PCI vendor ``0x1ae0`` with a TPU device id, :mod:`aios.devices.pci`;
  gVNIC shares the vendor), the interpreter's Python and torch versions (package metadata, no
  import) and whether an aios job of a cluster of the same name already runs there (then
  nothing is touched: one line, exit 2).
* **Devices and processes per host**: ``-a auto`` (the default) trains on CPU and refuses hosts
  that have accelerators (pass ``-a gpu|tpu|trainium``, or ``-a cpu`` to use the CPUs anyway);
  the processes per host are the accelerator count found (1 on CPU), or ``--nprocs-per-host``.
  They are recorded with each host and the launch plan uses them.
* **Master address**: the first host's address *as the other hosts see it*: the address of worker
  0 in a subnet where every host has its own address (the subnet of its SSH address first), or
  the one in ``--network CIDR``; when the hosts share no subnet, its SSH address, said in one line.
  Node ranks follow the host list.
* **Version-set check and aios's own discovery**: after setup, every host runs ``python -m
  aios.plugins.versions STACK`` for the backend's stack (cpu: torch must be installed) and ``aios devices
  --backend B --json`` (the backend must find a usable device); a failure is one line naming the
  host.
* **Managed restarts** (``--max-restarts N``): when a host is lost (its job processes died, it
  rebooted, its sshd stopped answering) the watcher ends the job on the other hosts, waits up to
  ``--host-wait`` seconds (default 120) for *every* host of the list to answer again and restarts
  the job on all of them from the newest checkpoint (same node ranks, same master). A host still
  down after that fails the attempt with one line naming it; the next restart tries again until
  the restarts are used up. aios does not go on without the host: the runtime resumes a
  checkpoint only at the world size that wrote it. The checkpoint directory is a bucket URL or an
  absolute path on a filesystem every host mounts; aios checks it is shared (a file written on
  worker 0 must be visible on every host) before the job starts.
* **What aios removes** (``aios down``; ``aios stop`` only ends the processes): in
  ``~/aios/<cluster>/`` on every host: ``jobs/`` (run.sh, env, pid, logs, exit codes),
  ``setup.sha``, ``agent.*``, ``code.new``, ``code/.aios-site`` (aios itself), the synced files
  the host's ``fleet/manifest.json`` lists, ``fleet/`` itself (the sync's store and the head's
  key) and the head key's line in ``~/.ssh/authorized_keys`` (only that line). Files the job
  wrote under ``code/`` (checkpoints, runs) are kept and named; the directory goes only when
  empty. A host that does not answer keeps its files (named).
* Host keys are pinned at the first connection (aios's per-cluster known_hosts); a changed host
  key is never trusted by itself: the launch, ``aios start`` or the managed restart stops with one
  line, and ``aios stop``/``down`` leave that host untouched (named).
"""

from __future__ import annotations

import builtins
import ipaddress
import os
import re
import shlex
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aios.devices.pci import tpu_count_shell
from aios.errors import AiosError

from aios_cloud.features import AUTOSTOP, CONTROLLER, HOST_LIST, LABELS, SETUP, SSH_LOGIN
from aios_cloud.fleet import HEAD_KEY_COMMENT
from aios_cloud.provider import (
    HEALTHY,
    READY,
    STOPPED,
    CatalogEntry,
    CloudCommand,
    CloudError,
    CloudProvider,
    ClusterHost,
    ClusterInfo,
    ClusterRequest,
    Echo,
    LaunchPlan,
    check_requirements,
)
from aios_cloud.request import LaunchRequest

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


def _resolve(host: str) -> str | None:
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET)
    except OSError:
        return None
    return str(infos[0][4][0]) if infos else None


# ------------------------------------------------------------------------------ the provider


@dataclass
class SshHost(ClusterHost):
    """A user's host as the cluster record keeps it: ``nprocs`` (processes the launch plan
    starts there) and ``devices`` (what the probe found) besides :class:`ClusterHost`'s fields."""

    nprocs: int = 1
    devices: str = ""


def _log(msg: str) -> None:
    sys.stderr.write(f"[aios] {msg}\n")
    sys.stderr.flush()


class SshHostsProvider(CloudProvider):
    """Hosts the user already has, reached over SSH. See the module docstring."""

    name = "ssh"
    storage_scheme = ""
    cli = "ssh"
    default_ssh_user = ""  # each host carries its own user
    default_accelerator = "auto"
    # the cli: no aios-made key is installed (the user's own SSH setup logs in), and a
    # managed run may keep its checkpoints on a path every host mounts (checked at launch)
    user_hosts = True
    shared_paths = True
    # capacity (spot, queued, reserved), images, disks, projects, regions and zones are the
    # clouds'; autostop stops machines, and aios never stops hosts it did not create; the
    # hosts have no prices to bound a spend with
    features = frozenset({SSH_LOGIN, SETUP, HOST_LIST, LABELS, CONTROLLER})
    feature_hints = {
        AUTOSTOP: "your hosts bill nothing to aios; `aios down NAME` ends aios's processes there",
    }

    def __init__(self, config: Any = None) -> None:
        self.config = config
        self.python_cmd = "python3"
        self.log = _log

    # -------------------------------------------------------------- the launch options
    def launch_extra(self, request: LaunchRequest, existing: bool = False) -> dict[str, Any]:
        """Check ``aios launch``'s host options (one line, exit 2) and return what the cluster
        request carries: the host list and how to use it (no secrets: the key is a path)."""
        if request.python:
            self.python_cmd = request.python  # the user's interpreter, used as it is
        elif not request.no_setup:
            # aios's own virtual environment on every host (created by setup, removed by
            # `aios down`): never an install into a system interpreter (PEP 668 refuses it on
            # Debian 12 / Ubuntu 24.04, and it would change the user's machine)
            self.python_cmd = VENV_PYTHON
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
            "python": self.python_cmd,
            "shared_checkpoint_dir": ckpt if managed and ckpt and "://" not in ckpt else None,
        }
        if existing:
            # a launch on an existing cluster uses its recorded hosts and plan: a different one
            # asked for here would be ignored silently, so it is refused
            name = request.name or ""
            rec = _record(name)
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

    # -------------------------------------------------------------- catalog
    def catalog(self) -> list[CatalogEntry]:
        what = {
            "auto": "host (CPU; a host with accelerators is refused)",
            "cpu": "host (its CPUs)",
            "gpu": "host (its NVIDIA GPUs)",
            "tpu": "host (its TPU chips)",
            "trainium": "host (its Neuron devices)",
        }
        return [
            CatalogEntry(
                cloud=self.name,
                accelerator=a,
                devices=1,
                device_kind=what[a],
                memory_gb=0.0,
                hosts=1,
                runtime="your hosts' own",
                zones=(ZONE,),
                backend=backend,
                extra={"price": "n/a (your hosts)"},
            )
            for a, (backend, _) in ACCELERATORS.items()
        ]

    def validate(self, request: ClusterRequest) -> ClusterRequest:
        self.entry(request.accelerator)
        specs = self._specs(request)
        if request.nodes not in (1, len(specs)):
            raise AiosError(
                f"--nodes {request.nodes} does not match the {len(specs)} hosts listed",
                "leave --nodes out: every listed host is a node",
            )
        if request.zone not in (None, ZONE) or request.region:
            raise AiosError("--zone/--region choose cloud locations", "drop them for --cloud ssh")
        if request.image or request.disk_gb:
            raise AiosError(
                "--image/--disk-gb choose what aios creates; --cloud ssh uses your hosts as they are",
                "drop them",
            )
        if request.extra.get("python"):
            self.python_cmd = request.extra["python"]
        return replace(request, nodes=len(specs), zone=ZONE, ssh_user="")

    def describe_credentials(self) -> str:
        return "your SSH keys, agent and ~/.ssh/config"

    def _specs(self, request: ClusterRequest | dict[str, Any]) -> list[HostSpec]:
        extra = request.extra if isinstance(request, ClusterRequest) else request.get("extra", {})
        return parse_hosts(list(extra.get("hosts") or []), "")

    # -------------------------------------------------------------- reaching the hosts
    def _runner(self, name: str, hosts: list[ClusterHost], key: str | None, **kw: Any) -> Any:
        from aios_cloud.ssh import SshRunner
        from aios_cloud.store import cluster_dir

        return SshRunner(
            hosts, cluster_dir(name) / "known_hosts", key=key, alias=f"aios-{name}", **kw
        )

    @staticmethod
    def _hosts(specs: list[HostSpec], key: str | None) -> list[ClusterHost]:
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

    def _reach(
        self, name: str, hosts: list[ClusterHost], key: str | None, wait: float, python: str
    ) -> tuple[dict[int, Probe], dict[int, str]]:
        """Probe every host until it answers or ``wait`` seconds passed. Returns the probes of the
        hosts that answered and why each other host did not. A changed host key or a refused
        login ends at once (waiting does not fix them)."""
        from aios_cloud.ssh import HostKeyChanged, SshError

        runner = self._runner(name, hosts, key, retries=0, connect_timeout=10)
        cmd = probe_command(name, python)
        probes: dict[int, Probe] = {}
        down: dict[int, str] = {}
        deadline = time.monotonic() + wait
        pending = list(hosts)

        def one(h: ClusterHost) -> tuple[ClusterHost, Any]:
            try:
                return h, runner.run_one(h, cmd, timeout=60, stream=False)
            except HostKeyChanged as exc:
                return h, exc
            except SshError as exc:
                return h, exc

        delay = 1.0
        while pending:
            with ThreadPoolExecutor(max_workers=min(16, len(pending))) as pool:
                results = list(pool.map(one, pending))
            pending = []
            for h, r in results:
                if isinstance(r, HostKeyChanged):
                    raise CloudError(
                        f"the host key of {h.label} ({_dest(h)}) changed since aios "
                        "first connected; aios does not trust it by itself",
                        f"if that machine was reinstalled, `aios down {name}` and launch again "
                        "(the key is pinned anew); otherwise find out why",
                    )
                if isinstance(r, SshError):
                    raise CloudError(
                        f"{h.label}: {r.message if hasattr(r, 'message') else r}",
                        f"check that `{shlex.join(dry_ssh(h, None, 'true')[:-3] + [_dest(h)])}` logs in without a "
                        "password (pass --identity KEY if it needs a key)",
                    )
                if r.returncode == 0:
                    probes[h.worker_id] = Probe.parse(r.stdout)
                    down.pop(h.worker_id, None)
                else:
                    down[h.worker_id] = (
                        _first(r.stderr) or _first(r.stdout) or f"ssh exit status {r.returncode}"
                    )
                    pending.append(h)
            if pending and time.monotonic() + delay <= deadline:
                time.sleep(delay)
                delay = min(delay * 2, 10.0)
            else:
                break
        return probes, down

    def _plan_hosts(
        self, request: ClusterRequest, recovering: bool
    ) -> tuple[list[SshHost], list[str]]:
        """Reach, inspect and check the hosts; the cluster's hosts and the notes to print."""
        name = request.name
        extra = request.extra
        specs = self._specs(request)
        key = extra.get("identity")
        # the probe reads versions only: the user's --python, else the host's python3 (aios's own
        # environment may not exist yet)
        python = _probe_python(extra.get("python") or self.python_cmd)
        wait = float(extra.get("host_wait", DEFAULT_HOST_WAIT))
        wait = wait if recovering else min(30.0, wait)
        hosts = self._hosts(specs, key)
        probes, down = self._reach(name, hosts, key, wait, python)
        notes: list[str] = []
        least = extra.get("min_hosts")
        if down and recovering and least and len(probes) >= least:
            # a managed run continues on the hosts that remain (--min-hosts); the watcher grows
            # it back onto every host at its next checkpoint after the others answer again
            which = "; ".join(f"{hosts[i].label}: {why}" for i, why in sorted(down.items()))
            notes.append(
                f"{len(down)} of {len(hosts)} hosts did not answer within {wait:.0f}s ({which}); "
                f"continuing on the {len(probes)} that did (--min-hosts {least}), and back on "
                f"all {len(hosts)} at the next checkpoint after they return"
            )
            down = {}
        elif down and recovering and least:
            which = "; ".join(f"{hosts[i].label}: {why}" for i, why in sorted(down.items()))
            raise CloudError(
                f"only {len(probes)} of {len(hosts)} hosts answer over SSH after {wait:.0f}s, "
                f"fewer than --min-hosts {least} ({which}); the run waits for them",
                "bring the hosts back (the watcher retries while restarts remain), or `aios "
                f"down {name}`",
            )
        if down:
            which = "; ".join(f"{hosts[i].label}: {why}" for i, why in sorted(down.items()))
            fix = (
                "bring the host back, then `aios start "
                f"{name}` and launch again (the checkpoint resumes only with every host: the "
                "runtime refuses another world size), or `aios down` and relaunch on the others "
                "with checkpoint.resume=false"
                if recovering
                else "check that the hosts are up and sshd reachable, or leave them out of --hosts"
            )
            raise CloudError(
                f"{len(down)} of {len(hosts)} hosts did not answer over SSH within {wait:.0f}s ({which})",
                fix,
            )
        busy = [(i, p.busy) for i, p in probes.items() if p.busy]
        if busy and not recovering:
            i, jobs = busy[0]
            raise CloudError(
                f"{hosts[i].label} already runs aios job {jobs[0]} of a cluster named '{name}' "
                "(launched from another machine?); nothing was touched",
                "pick another --name, or stop that job first",
            )
        up = [h for h in hosts if h.worker_id in probes]
        accel = request.accelerator
        backend, kind = ACCELERATORS[accel]
        for h in up:
            p = probes[h.worker_id]
            has = p.gpus or p.tpu or p.neuron
            if accel == "auto" and has:
                raise CloudError(
                    f"{h.label} has {p.devices()}; -a auto trains on CPU only",
                    "pass -a gpu, -a tpu or -a trainium to use them (or -a cpu to use the CPUs anyway)",
                )
            if kind and not p.count(kind):
                raise CloudError(
                    f"{h.label} has no {ACCELERATORS[accel][1] or 'accelerator'} for -a {accel} "
                    f"(found {p.devices()})",
                    "list only hosts that have them, or pass the -a their devices match",
                )
            if accel == "cpu" and has:
                notes.append(f"{h.label} has {p.devices()}; -a cpu leaves them unused")
        wanted = extra.get("nprocs_per_host")
        counts = {h.worker_id: (probes[h.worker_id].count(kind) or 1) for h in up}
        if wanted:
            nprocs = int(wanted)
        else:
            nprocs = min(counts.values())
            if len(set(counts.values())) > 1:
                notes.append(
                    f"the hosts differ ({', '.join(f'worker {i}: {c}' for i, c in counts.items())} "
                    f"devices); starting {nprocs} processes on each"
                )
        ssh_addrs = [_resolve(h.ip) for h in up]
        internal, how = internal_addresses(
            [probes[h.worker_id] for h in up], ssh_addrs, extra.get("network")
        )
        if len(up) > 1 and internal[0] is None:
            internal = [h.ip for h in up]
            notes.append(
                f"the hosts share no subnet: they reach worker {up[0].worker_id} at its SSH address "
                f"{up[0].ip} (pass --network CIDR to pick their network)"
            )
        elif len(up) > 1:
            notes.append(
                f"master address {internal[0]} (worker {up[0].worker_id} as the other hosts see it, {how})"
            )
        # the hosts that answered are the workers, numbered from 0 (node ranks follow them)
        out = [
            SshHost(
                j,
                h.ip,
                internal[j] or h.ip,
                ssh_user=h.ssh_user,
                port=h.port,
                internal_port=h.internal_port or int(extra.get("worker_port") or 22),
                nprocs=nprocs,
                devices=probes[h.worker_id].devices(),
            )
            for j, h in enumerate(up)
        ]
        shared = extra.get("shared_checkpoint_dir")
        if shared and not recovering:
            self._check_shared(name, [h for h in hosts if h.worker_id in probes], key, shared)
        return out, notes

    def _check_shared(
        self, name: str, hosts: list[ClusterHost], key: str | None, path: str
    ) -> None:
        """A managed run's local checkpoint directory must be one filesystem for every host."""
        marker = f"{path.rstrip('/')}/.aios-shared-{os.getpid()}-{int(time.time() * 1000)}"
        runner = self._runner(name, hosts, key, retries=1)
        q, d = shlex.quote(marker), shlex.quote(path)
        head = runner.run_one(hosts[0], f"mkdir -p {d} && echo {name} > {q}", stream=False)
        if not head.ok:
            raise CloudError(
                f"--checkpoint-dir {path}: {hosts[0].label} cannot write there ({_first(head.stderr)})",
                "pass a directory every host can write, or a bucket URL",
            )
        try:
            seen = runner.run(f"test -f {q}", stream=False, hosts=hosts[1:])
        finally:
            runner.run_one(hosts[0], f"rm -f {q}", stream=False)
        blind = [r.host.label for r in seen if not r.ok]
        if blind:
            raise CloudError(
                f"--checkpoint-dir {path} is not shared: {blind[0]} does not see a file {hosts[0].label} wrote there",
                "use a path on a filesystem every host mounts (NFS), or a bucket URL",
            )

    # -------------------------------------------------------------- lifecycle
    def create(self, request: ClusterRequest) -> ClusterInfo:
        rec = _record(request.name)
        recovering = bool(rec and rec.hosts)
        hosts, notes = self._plan_hosts(request, recovering)
        for n in notes:
            self.log(n)
        self.log(
            f"{len(hosts)} hosts: "
            + ", ".join(
                f"worker {h.worker_id} {h.ip} ({h.devices}, {h.nprocs} proc)" for h in hosts
            )
        )
        return self._info(request.name, request.accelerator, READY, list(hosts))

    def returned_hosts(
        self, request: ClusterRequest, hosts: builtins.list[ClusterHost]
    ) -> builtins.list[str]:
        """The listed hosts the run continued without (``--min-hosts``) that answer again."""
        have = {(h.ssh_user, h.ip, h.port) for h in hosts}
        specs = self._specs(request)
        missing = [s for s in specs if (s.user, s.host, s.port) not in have]
        if not missing or len(missing) == len(specs):
            return []
        key = request.extra.get("identity")
        every = self._hosts(specs, key)
        probe = [h for h in every if (h.ssh_user, h.ip, h.port) not in have]
        python = request.extra.get("python") or self.python_cmd
        try:
            probes, _ = self._reach(request.name, probe, key, 0.0, python)
        except CloudError:  # answers with another key or refuses the login: not back
            return []
        return [f"{h.ssh_user}@{h.ip}:{h.port}" for h in probe if h.worker_id in probes]

    def _info(self, name: str, accel: str, state: str, hosts: list[ClusterHost]) -> ClusterInfo:
        return ClusterInfo(name, self.name, ZONE, accel, state, HEALTHY, hosts=hosts)

    def describe(self, name: str, zone: str | None) -> ClusterInfo | None:
        rec = _record(name)
        if rec is None:
            return None
        hosts: list[ClusterHost] = [
            SshHost(**{k: v for k, v in h.items() if k in _SSH_HOST_FIELDS}) for h in rec.hosts
        ]
        state = STOPPED if rec.state == STOPPED else READY
        return self._info(name, rec.accelerator, state, hosts)

    def list(self, zone: str | None = None) -> list[ClusterInfo]:
        return []  # every ssh cluster has its local record; nothing else exists to find

    def start(self, name: str, zone: str | None) -> ClusterInfo:
        from aios_cloud.records import request_from_record

        rec = _record(name)
        if rec is None:
            raise CloudError(f"no ssh cluster named '{name}'", "see `aios status`")
        request = request_from_record(rec)
        hosts, notes = self._plan_hosts(request, recovering=True)
        for n in notes:
            self.log(n)
        return self._info(name, rec.accelerator, READY, list(hosts))

    def grant_autostop(self, name: str, zone: str | None, action: str) -> None:
        raise CloudError(
            "autostop stops or deletes machines; aios never stops hosts it did not create",
            f"your hosts bill nothing to aios; `aios down {name}` ends aios's processes there",
        )

    def stop(self, name: str, zone: str | None) -> None:
        self._clean(name, remove=False)

    def delete(self, name: str, zone: str | None) -> None:
        self._clean(name, remove=True)

    def _clean(self, name: str, remove: bool) -> None:
        """End aios's processes of cluster ``name`` on every listed host that answers; with
        ``remove`` also delete aios's own files there (see the module docstring)."""
        rec = _record(name)
        if rec is None or not rec.hosts:
            # never reached (a create that failed at the probe): nothing of it is on the hosts,
            # and what is there under this name belongs to someone else
            return
        specs = self._specs(rec.request)
        key = (rec.request.get("extra") or {}).get("identity")
        hosts = self._hosts(specs, key)
        if not hosts:
            return
        runner = self._runner(name, hosts, key, retries=1, connect_timeout=8)
        from aios_cloud.ssh import HostKeyChanged, HostResult, SshError

        cmd = cleanup_command(name, remove)

        def one(h: ClusterHost) -> HostResult:
            try:
                return runner.run_one(h, cmd, timeout=90, stream=False)
            except HostKeyChanged:
                return HostResult(h, 255, stderr=["its host key changed: not touched"])
            except SshError as exc:
                return HostResult(h, 255, stderr=[str(exc)])

        with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
            results = list(pool.map(one, hosts))
        for r in results:
            if not r.ok:
                self.log(
                    f"{r.host.label} did not answer ({_first(r.stderr) or r.returncode}); aios's "
                    f"processes and files of {name} there (~/aios/{name}) were left as they are"
                )
            for line in r.stdout:
                if line.startswith("kept "):
                    self.log(f"{r.host.label}: {line}")

    # -------------------------------------------------------------- runtime
    def setup_commands(
        self, accelerator: str, requirements: builtins.list[str], backend: str | None = None
    ) -> builtins.list[str]:
        """With aios's own environment (no ``--python``): create it in the cluster's directory
        (``uv venv`` where uv is installed, else the host's ``python3 -m venv``), with the
        system's site packages visible so that a torch the host already has is used as it is,
        and install there only the requirements it lacks (nothing is upgraded, nothing goes into
        a system interpreter). With ``--python``: that interpreter is used as it is, nothing is
        installed (the host checks say in one line when it lacks torch)."""
        check_requirements(requirements)
        if self.python_cmd != VENV_PYTHON:
            return []
        venv = VENV_DIR
        # the host interpreter's own site directories stay visible (a .pth after the venv's
        # own: what is installed into the venv wins), also when python3 is itself a venv or a
        # conda env, where --system-site-packages alone would not see its packages
        host_paths = (
            "import sys; print(chr(10).join(p for p in sys.path "
            "if p.endswith(('site-packages', 'dist-packages'))))"
        )
        venv_purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
        lines = [
            f"if [ ! -x {VENV_PYTHON} ]; then "
            f"if command -v uv >/dev/null 2>&1; then uv venv -q --system-site-packages "
            f"--python python3 {venv}; else python3 -m venv --system-site-packages {venv}; fi "
            f"|| {{ echo \"[aios] $(hostname): cannot create aios's environment {venv} with "
            'python3 -m venv (Debian/Ubuntu: apt install python3-venv), or pass --python"; '
            f"exit 2; }}; : > {venv}/{VENV_MARKER}; python3 -c {shlex.quote(host_paths)} > "
            f'"$({VENV_PYTHON} -c {shlex.quote(venv_purelib)})/_aios_host.pth"; fi',
        ]
        if requirements:
            reqs = " ".join(shlex.quote(r) for r in requirements)
            find = (
                "import importlib.metadata as m, re, sys\n"
                "for r in sys.argv[1:]:\n"
                "    n = re.split(r'[<>=!~ ;\\[]', r, maxsplit=1)[0]\n"
                "    try: m.version(n)\n"
                "    except m.PackageNotFoundError: print(r)\n"
            )
            lines += [
                f"missing=$({VENV_PYTHON} -c {shlex.quote(find)} {reqs})",
                f'if [ -n "$missing" ]; then echo "[aios] installing $(echo $missing) into {venv}"; '
                f"if command -v uv >/dev/null 2>&1; then uv pip install -q --python {VENV_PYTHON} "
                f"$missing; else {VENV_PYTHON} -m pip install --quiet $missing; fi; fi",
            ]
        return [*lines, torch_setup(backend or self.backend_for(accelerator))]

    def host_checks(self, accelerator: str, nodes: int) -> builtins.list[str]:
        """Run on every host after setup (also with ``--no-setup``): the version-set check of the
        backend's stack (cpu: torch installed), then aios's own device discovery there (``aios
        devices --backend B --json``), each failing with one line naming the host."""
        backend = ACCELERATORS.get(accelerator, ("cpu", ""))[0]
        py = shlex.quote(self.python_cmd)
        site = 'PYTHONPATH=".aios-site${PYTHONPATH:+:$PYTHONPATH}"'
        stack = STACK.get(backend)
        if stack:
            versions = f'{site} {py} -m aios.plugins.versions {stack} --host "$(hostname)"'
        else:
            fix = (
                "setup, which installs it there, was skipped (--no-setup or --setup-script): "
                "launch without those, or pass --python with an interpreter that has it"
                if self.python_cmd == VENV_PYTHON
                else "install it there, or pass --python with an interpreter that has it"
            )
            versions = (
                f'{py} -c "import importlib.metadata as m; m.version(\\"torch\\")" 2>/dev/null || '
                f'{{ echo "[aios] $(hostname): torch is not installed for {self.python_cmd}; '
                f'{fix}"; exit 2; }}'
            )
        judge = (
            "import json, socket, sys; r = json.load(sys.stdin)[0]; h = socket.gethostname(); "
            'a, b, k, c, why = r["available"], r["backend"], r["kind"], r["count"], r["reason"]; '
            'print("[aios] %s: %s x %s (%s)" % (h, c, k, b) if a else '
            '"[aios] %s: aios finds no usable %s device (%s)" % (h, b, why)); '
            "sys.exit(0 if a else 2)"
        )
        devices = (
            f"{site} {py} -m aios.cli.main devices --backend {backend} --json | "
            f"{py} -c {shlex.quote(judge)}"
        )
        return [versions, devices]

    def backend_for(self, accelerator: str) -> str:
        self.entry(accelerator)
        return ACCELERATORS[accelerator][0]

    def python(self, accelerator: str, backend: str | None = None) -> str:
        """``--python`` as given, else aios's own environment (:data:`VENV_PYTHON`)."""
        return self.python_cmd

    def stop_refusal(self, spot: bool, accelerator: str | None = None) -> str | None:
        """``aios stop`` ends aios's processes on the hosts; the hosts keep running (never
        stopped: aios did not create them)."""
        return None

    def repair(self, info: ClusterInfo) -> str:
        raise CloudError("hosts aios did not create are not repaired", "")

    # -------------------------------------------------------------- dry run
    def render_create(self, request: ClusterRequest) -> builtins.list[CloudCommand]:
        extra = request.extra
        py = _probe_python(extra.get("python") or self.python_cmd)
        return [
            CloudCommand(
                dry_ssh(h, extra.get("identity"), probe_command(request.name, py)),
                f"worker {h.worker_id}: reach and inspect (read only)",
            )
            for h in self._hosts(self._specs(request), extra.get("identity"))
        ]

    def render(self, action: str, name: str, zone: str | None) -> builtins.list[CloudCommand]:
        rec = _record(name)
        if rec is None:
            return []
        key = (rec.request.get("extra") or {}).get("identity")
        hosts = self._hosts(self._specs(rec.request), key)
        if action in ("delete", "stop"):
            cmd = cleanup_command(name, action == "delete")
            what = (
                "end aios's processes, remove aios's files (the synced files the host's "
                "fleet/manifest.json lists too; files the job wrote are kept)"
                if action == "delete"
                else "end aios's processes; the host keeps running"
            )
        elif action in ("start", "describe"):
            cmd, what = (
                probe_command(name, _probe_python(self.python_cmd)),
                "reach and inspect (read only)",
            )
        else:
            return []
        return [CloudCommand(dry_ssh(h, key, cmd), f"worker {h.worker_id}: {what}") for h in hosts]

    def render_launch(self, plan: LaunchPlan, echo: Echo) -> None:
        """``aios launch --cloud ssh --dry-run``: the path the launch takes, as commands that
        run as printed (``bash -e`` on this machine). Each host is reached and inspected from
        here; then, as the launch does, the code goes to worker 0 once and worker 0 copies it to
        the other hosts, and setup and the start reach every other host through worker 0 (your
        key forwarded by an ssh-agent, never copied)."""
        from aios.config.schema import redact

        from aios_cloud.codesync import collect, data_line, secret_files
        from aios_cloud.jobs import host_commands, setup_script
        from aios_cloud.records import remote_root
        from aios_cloud.store import ClusterRecord

        request, spec = plan.cluster, plan.spec
        key = request.extra.get("identity")
        nprocs = request.extra.get("nprocs_per_host")
        hosts = [
            SshHost(
                h.worker_id,
                h.ip,
                h.ip,
                ssh_user=h.ssh_user,
                port=h.port,
                internal_port=h.internal_port or int(request.extra.get("worker_port") or 22),
                nprocs=nprocs or 1,
            )
            for h in self._hosts(self._specs(request), key)
        ]
        root = remote_root(request.name)
        relay = _Relay(hosts, key, root)
        echo("# dry run: nothing changes on the hosts, no SSH connection is made")
        for h in hosts:
            if not h.ssh_user or not h.port:
                # the alias as written: ssh's own configuration picks user, port, address
                echo(
                    f"# worker {h.worker_id}: ssh host {h.ip} as your ~/.ssh/config has it"
                    + ("" if h.ssh_user else " (its User)")
                    + ("" if h.port else " (its Port)")
                )
        echo("# 1. reach and inspect every host (addresses, devices, python and torch; read only)")
        for c in self.render_create(request):
            echo(c.shell())
        if len(hosts) > 1:
            echo(
                "# worker 0 reaches the other hosts with your key, through an ssh-agent here "
                "(forwarded, never copied)"
            )
            echo(relay.agent_start())
        files = collect(spec.workdir, spec.excludes)
        echo(
            f"# 2. code sync: {len(files)} files from {spec.workdir} (gitignore honoured; .git, "
            "checkpoints, untracked data folders excluded), once, to worker 0"
            + (
                "; aios adds itself (code/.aios-site), the lines below ship your files"
                if spec.bundle
                else ""
            )
        )
        left = data_line(spec.workdir, spec.excludes)
        if left:
            echo(f"# {left}")
        if secret_files(spec.workdir, spec.excludes):
            echo(
                f"# left out {len(secret_files(spec.workdir, spec.excludes))} secret-looking "
                "files (use --env NAME)"
            )
        # files are written over in place: what a job wrote under code/ (runs, checkpoints) stays
        untar = f"set -e; mkdir -p {root}/code; tar xzf - -C {root}/code"
        tar = f"tar czf - -C {shlex.quote(spec.workdir)} " + " ".join(shlex.quote(f) for f in files)
        echo(f"{tar} | {shlex.join(dry_ssh(hosts[0], key, untar))}")
        if len(hosts) > 1:
            echo(f"# worker 0 copies the code to the other {len(hosts) - 1} hosts")
            echo(relay.copy_code())
        if spec.setup_lines:
            echo("# 3. setup, then the version-set check, on every host (through worker 0)")
            script = setup_script(spec).rstrip("\n")
            for h in hosts:  # the script on stdin, as written (a quoted heredoc: no expansion)
                echo(relay.on(h, f"cd {root}/code && bash -s") + " <<'AIOS_SETUP'")
                echo(script)
                echo("AIOS_SETUP")
        rec = ClusterRecord(
            request.name,
            self.name,
            ZONE,
            request.accelerator,
            False,
            "DRY-RUN",
            hosts=[_asdict(h) for h in hosts],
        )
        plans = host_commands(rec, spec, plan.config)
        env = dict(spec.env)
        if spec.checkpoint_dir:
            env["AIOS_CHECKPOINT__DIR"] = spec.checkpoint_dir
        for n in spec.forward_env:
            env[n] = "<forwarded from your environment>"
        env = redact(env)
        echo(
            f"# 4. run on every host ({nprocs or 'discovered: accelerators found, else 1'} "
            f"processes each; node ranks in host order; the master address is worker 0's "
            f"address on the network the hosts share, found in step 1 (shown: its SSH address)); "
            f"all hosts at once through worker 0: here in the background of this shell, aios "
            f"starts it detached with logs in {root}/jobs/<id>/worker.log"
        )
        for h in hosts:
            hp = plans[h.worker_id]
            full = {**env, **hp.env}
            prefix = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in sorted(full.items()))
            echo(relay.on(h, f"cd {root}/code && {prefix} {shlex.join(hp.command)}") + " &")
        echo("wait")
        if len(hosts) > 1:
            echo(relay.agent_stop())
        if spec.checkpoint_dir:
            echo(
                "# managed: a lost host stops the job on the others; aios waits "
                f"{request.extra.get('host_wait', DEFAULT_HOST_WAIT):g}s for every host, then "
                f"restarts on those that answer, resuming from {spec.checkpoint_dir}"
            )


class _Relay:
    """Commands on the hosts as the launch runs them: on worker 0 directly, on every other host
    through worker 0 (``ssh -A`` to worker 0, which runs ``ssh`` to the host at the address
    shown), host keys pinned in worker 0's ``ROOT/fleet/known_hosts``."""

    def __init__(self, hosts: list[SshHost], key: str | None, root: str) -> None:
        self.hosts, self.key, self.root = hosts, key, root
        self.head = hosts[0]

    def agent_start(self) -> str:
        add = f" && ssh-add -q {shlex.quote(self.key)}" if self.key else ""
        return f'eval "$(ssh-agent -s)" > /dev/null{add}'

    def agent_stop(self) -> str:
        return "ssh-agent -k > /dev/null"

    def _hop(self, h: ClusterHost, command: str) -> list[str]:
        """The ``ssh`` worker 0 runs to reach ``h``."""
        argv = [
            "ssh",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=accept-new",
            "-o",
            # %d: the login's home on worker 0 (ssh's own token; the root starts with $HOME)
            f"UserKnownHostsFile={self.root.replace('$HOME', '%d', 1)}/fleet/known_hosts",
        ]
        port = h.internal_port if h.internal_port is not None else (h.port or 22)
        if port != 22:
            argv += ["-p", str(port)]
        return [*argv, _dest(h), command]

    def on(self, h: ClusterHost, command: str) -> str:
        """``command`` on ``h``, through worker 0 unless ``h`` is worker 0."""
        if h.worker_id == self.head.worker_id:
            return shlex.join(dry_ssh(h, self.key, command))
        inner = f"mkdir -p {self.root}/fleet && " + shlex.join(self._hop(h, command))
        return shlex.join(["ssh", "-A", *dry_ssh(self.head, self.key, inner)[1:]])

    def copy_code(self) -> str:
        """Worker 0 sends its copy of the code to every other host (one stream each)."""
        untar = f"set -e; mkdir -p {self.root}/code; tar xzf - -C {self.root}/code"
        parts = [
            f"tar czf - -C {self.root}/code . | " + shlex.join(self._hop(h, untar))
            for h in self.hosts[1:]
        ]
        inner = f"set -e; mkdir -p {self.root}/fleet; " + "; ".join(parts)
        return shlex.join(["ssh", "-A", *dry_ssh(self.head, self.key, inner)[1:]])


_SSH_HOST_FIELDS = {f for f in SshHost.__dataclass_fields__}


def _asdict(h: ClusterHost) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(h)


def dry_ssh(host: ClusterHost, key: str | None, command: str) -> list[str]:
    """A plain ``ssh`` argv that runs ``command`` on ``host`` (for dry runs: touches nothing)."""
    argv = ["ssh"]
    if key:
        argv += ["-i", key]
    if host.port:  # only when the user gave it: otherwise ssh_config decides
        argv += ["-p", str(host.port)]
    return [*argv, "-o", "BatchMode=yes", _dest(host), command]


def _dest(h: ClusterHost) -> str:
    """``user@host`` when the user gave the user, else the host (or ``~/.ssh/config`` alias)
    alone: ssh_config decides, as the command line would override it (ssh_config(5))."""
    return f"{h.ssh_user}@{h.ip}" if h.ssh_user else h.ip


def cleanup_command(name: str, remove: bool) -> str:
    """End the process groups of cluster ``name``'s jobs and its agent on a host; with
    ``remove`` delete aios's own files there (the synced files the host's manifest lists, the
    sync's store, the head's key line in authorized_keys), keeping and naming whatever else the
    job wrote."""
    root = f'"$HOME/aios/{name}"'
    lines = [
        f"R={root}",
        'for p in "$R"/jobs/*/pid "$R"/agent.pid; do [ -f "$p" ] || continue; '
        'g=$(cat "$p"); kill -TERM -- -"$g" 2>/dev/null || kill -TERM "$g" 2>/dev/null; done',
        'for p in "$R"/jobs/*/pid "$R"/agent.pid; do [ -f "$p" ] || continue; g=$(cat "$p"); '
        'for i in $(seq 50); do kill -0 "$g" 2>/dev/null || break; sleep 0.1; done; '
        'kill -KILL -- -"$g" 2>/dev/null || kill -KILL "$g" 2>/dev/null; done',
    ]
    if remove:
        lines += [
            'rm -rf "$R"/jobs "$R"/setup.sha "$R"/agent.json "$R"/agent.pid "$R"/agent.log '
            '"$R"/agent.state "$R"/code.new "$R"/code/.aios-site',
            # aios's environment only when aios made it (its marker): never one it did not write
            f'if [ -f "$R/code/{VENV_DIR}/{VENV_MARKER}" ]; then rm -rf "$R/code/{VENV_DIR}"; fi',
        ]
        # the files the last sync wrote, as the host's own manifest lists them (aios's code sync
        # through the head host); then that sync's store, and the head's key to the other hosts:
        # its public half leaves every host's authorized_keys (only the line aios added)
        lines += [
            '[ -f "$R/fleet/manifest.json" ] && python3 -c \'import json, sys\n'
            'for p, _s, _m in json.load(open(sys.argv[1])): print(p)\' "$R/fleet/manifest.json" '
            '| while IFS= read -r f; do case "$f" in ""|/*|*..*) continue;; esac; '
            'rm -f -- "$R/code/$f"; done',
            # (cluster names are [-a-z0-9]: no pattern characters)
            f'K=$(grep -x ".* {HEAD_KEY_COMMENT} {name}" "$HOME/.ssh/authorized_keys" '
            '2>/dev/null || true); if [ -n "$K" ]; then A="$HOME/.ssh/authorized_keys"; '
            'grep -vxF "$K" "$A" > "$A.aios-down" || true; chmod 600 "$A.aios-down"; '
            'mv "$A.aios-down" "$A"; fi',
            'rm -rf "$R/fleet"',
        ]
        lines += [
            '[ -d "$R/code" ] && find "$R/code" -depth -type d -empty -delete',
            'if [ -d "$R/code" ]; then n=$(find "$R/code" -type f | wc -l); '
            'echo "kept $n files the job wrote in $R/code: $(cd "$R/code" && find . -maxdepth 1 '
            '-mindepth 1 | head -n 5 | tr "\\n" " ")"; '
            'else rmdir "$R" 2>/dev/null; rmdir "$HOME/aios" 2>/dev/null; fi',
        ]
    lines.append("true")
    return "; ".join(lines)


#: aios's own interpreter on a user's host: a virtual environment in the cluster's code
#: directory (where setup, checks and jobs run), removed by `aios down` when aios made it
VENV_DIR = ".aios-venv"
VENV_PYTHON = f"{VENV_DIR}/bin/python"
#: the file aios writes into the environment it made (`aios down` removes only such a one)
VENV_MARKER = ".made-by-aios"
#: the torch aios installs into its own environment on a CPU host that has none: the build the
#: project tests and the root README installs (the host's pip configuration picks where from)
CPU_TORCH = "torch==2.13.0"


def torch_wanted(backend: str) -> str:
    """A shell expression that prints the pip arguments of the torch ``backend`` needs: the
    CPU pin, the accelerator stacks' first known-good set (:data:`aios.plugins.versions.STACKS`), for
    CUDA the newest set whose minimum driver the host's ``nvidia-smi`` meets (nothing when
    none: the setup then stops with the line to pass)."""
    from aios.plugins.versions import sets_for

    if backend not in STACK:
        return f"echo {shlex.quote(CPU_TORCH)}"
    sets = sets_for(STACK[backend])
    if backend != "cuda":
        return f"echo {shlex.quote(_pip_args(sets[0].install))}"
    table = [(dict(v.requires)["nvidia-driver"].lstrip(">="), _pip_args(v.install)) for v in sets]
    pick = (
        "import subprocess\n"
        "try:\n"
        "    d = subprocess.run(['nvidia-smi', '--query-gpu=driver_version', "
        "'--format=csv,noheader'], capture_output=True, text=True).stdout.split()[0]\n"
        "except (OSError, IndexError):\n"
        "    d = ''\n"
        "v = tuple(int(x) for x in d.split('.') if x.isdigit())\n"
        f"for need, args in {table!r}:\n"
        "    if v and v >= tuple(int(x) for x in need.split('.')):\n"
        "        print(args)\n"
        "        break\n"
    )
    return f"python3 -c {shlex.quote(pick)}"


def _pip_args(install: str) -> str:
    """``pip install A 'B>=1' --index-url U`` -> ``A B>=1 --index-url U`` (split by the shell
    unquoted, with globbing off)."""
    words = shlex.split(install)
    return " ".join(words[2:] if words[:2] == ["pip", "install"] else words)


def torch_setup(backend: str) -> str:
    """The setup line that gives aios's own environment the torch of ``backend`` when neither
    it nor the host's python3 has one: installed with the environment's pip (the host's pip
    configuration applies: index, find-links, constraints; uv's where only uv is there), said
    in one line with the time it took; when that fails, one line with the ``--requirements``
    to pass instead, exit 2. A torch there already (the host's, or the user's
    ``--requirements``) is used as it is."""
    venv = VENV_DIR
    has = f"{VENV_PYTHON} -c \"import importlib.metadata as m; m.version('torch')\" 2>/dev/null"
    log = f"{venv}/torch-install.log"
    install = (
        "set -f; "
        f"if {VENV_PYTHON} -m pip --version >/dev/null 2>&1; then "
        f"{VENV_PYTHON} -m pip install --quiet $want; "
        f"elif command -v uv >/dev/null 2>&1; then uv pip install -q --python {VENV_PYTHON} $want; "
        f"else python3 -m pip --python {VENV_PYTHON} install --quiet $want; fi"
    )
    return (
        f"if ! {has}; then want=$({torch_wanted(backend)}); t0=$(date +%s); "
        f'if [ -n "$want" ] && ( {install} ) > {log} 2>&1 && {has}; then '
        f'echo "[aios] $(hostname): python3 has no torch: installed $want ({backend}) into '
        f'{venv} in $(( $(date +%s) - t0 ))s"; else '
        f'why=$(grep -v "^ *$" {log} 2>/dev/null | tail -n 1 | cut -c1-200 || true); '
        f'echo "[aios] $(hostname): python3 has no torch and installing '
        f"${{want:-a {backend} torch}} into {venv} failed (${{why:-no torch build fits the "
        f"host}}): name a torch these hosts can install in a file and pass it, e.g. "
        f"echo '${{want:-torch}}' > requirements.txt and --requirements requirements.txt "
        f'(or --python with an interpreter that has torch)"; exit 2; fi; fi'
    )


def _probe_python(python: str) -> str:
    return "python3" if python == VENV_PYTHON else python


def _record(name: str) -> Any:
    from aios_cloud.store import Store

    return Store().get_cluster(name)


def _local_user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return os.environ.get("USER", "root")


def _first(lines: list[str]) -> str:
    for line in lines:
        if line.strip() and not line.startswith("Warning: Permanently added"):
            return line.strip()[:200]
    return ""


__all__ = [
    "HostSpec",
    "Probe",
    "SshHost",
    "SshHostsProvider",
    "cleanup_command",
    "internal_addresses",
    "parse_hosts",
    "probe_command",
    "read_hosts_file",
    "split_hosts",
]
