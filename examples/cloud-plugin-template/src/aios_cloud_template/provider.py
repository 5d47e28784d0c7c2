"""``aios launch --cloud pool``: a pool of SSH machines (a team's lab, reserved servers) that aios
leases hosts from. A "cluster" is a lease of ``--nodes`` free machines, recorded in a lease file
(locked while it changes: two launches never lease the same machine); the cluster's SSH key is
added to each leased machine with the pool's own identity and taken back when the lease ends.

Everything aios asks of a cloud is a :class:`aios_cloud.provider.CloudProvider` member; the
commands (launch, status, logs, down, ...) and the launch itself (sync, setup, start, watch)
come from aios-cloud. Prove your provider with
:class:`aios_cloud.testing.provider_contract.ProviderContract`.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import json
import os
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aios_cloud.features import LABELS, SETUP
from aios_cloud.provider import (
    READY,
    CapacityError,
    CatalogEntry,
    CloudCommand,
    CloudError,
    CloudProvider,
    ClusterHost,
    ClusterInfo,
    ClusterRequest,
    check_requirements,
)

from aios_cloud_template.settings import PoolSettings

ZONE = "pool"


def _target(entry: str) -> tuple[str, str, int]:
    """``USER@HOST[:PORT]`` as ``(user, host, port)``."""
    user, _, rest = entry.rpartition("@")
    host, colon, port = rest.partition(":")
    if not user or not host or (colon and not port.isdigit()):
        raise CloudError(f"pool.hosts entry '{entry}' is not USER@HOST[:PORT]", "fix pool.hosts")
    return user, host, int(port) if colon else 22


class PoolProvider(CloudProvider):
    """Leases machines from ``pool.hosts``."""

    name = "pool"
    storage_scheme = ""
    cli = "ssh"
    # what of `aios launch` the pool supports; every other option (--spot, --zone, ...) is
    # refused by aios in one line before anything runs
    features = frozenset({SETUP, LABELS})

    def __init__(self, config: Any = None) -> None:
        section = config.section("pool") if config is not None else None
        self.settings: PoolSettings = section if section is not None else PoolSettings()
        # the login on the machines: each pool entry names its own (USER@HOST)
        self.default_ssh_user = _target(self.settings.hosts[0])[0] if self.settings.hosts else ""

    # -------------------------------------------------------------- the lease file
    @property
    def leases_path(self) -> Path:
        if self.settings.leases:
            return Path(self.settings.leases).expanduser()
        return Path(os.environ.get("AIOS_HOME") or Path.home() / ".aios") / "pool-leases.json"

    @contextlib.contextmanager
    def _leases(self) -> Iterator[dict[str, Any]]:
        """The leases, locked; written back when the block ends without an error."""
        path = self.leases_path
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            leases = json.loads(path.read_text()) if path.exists() else {}
            yield leases
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(leases, indent=1))
            tmp.replace(path)

    def _read(self) -> dict[str, Any]:
        path = self.leases_path
        leases: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        return leases

    # -------------------------------------------------------------- catalog
    def catalog(self) -> builtins.list[CatalogEntry]:
        return [
            CatalogEntry(
                cloud=self.name,
                accelerator="cpu",
                devices=self.settings.devices,
                device_kind="CPU core",
                memory_gb=0.0,
                hosts=1,
                runtime="the machine's python3",
                zones=(ZONE,),
                backend="cpu",
                extra={"price": "n/a (your pool)", "machines": len(self.settings.hosts)},
            )
        ]

    def validate(self, request: ClusterRequest) -> ClusterRequest:
        request = super().validate(request)
        if not self.settings.hosts:
            raise CloudError("the pool has no machines", "set pool.hosts (AIOS_POOL__HOSTS)")
        for entry in self.settings.hosts:
            _target(entry)
        return request

    # -------------------------------------------------------------- lifecycle
    def create(self, request: ClusterRequest) -> ClusterInfo:
        with self._leases() as leases:
            if request.name in leases:
                raise CloudError(
                    f"cluster {request.name} already holds a lease",
                    f"`aios down {request.name}` first",
                )
            taken = {h for lease in leases.values() for h in lease["hosts"]}
            free = [h for h in self.settings.hosts if h not in taken]
            if len(free) < request.nodes:
                raise CapacityError(
                    f"the pool has {len(free)} free machines, the launch needs {request.nodes}",
                    "wait for a lease to end (`aios status`), or pass fewer --nodes",
                )
            hosts = free[: request.nodes]
            leases[request.name] = {
                "hosts": hosts,
                "accelerator": request.accelerator,
                "labels": request.labels,
                "key": request.ssh_public_key,
            }
        try:
            if request.ssh_public_key:
                for h in hosts:
                    self._ssh(h, _add_key(request.name), stdin=request.ssh_public_key)
        except BaseException:
            self.delete(request.name, ZONE)  # nothing left behind
            raise
        info = self.describe(request.name, ZONE)
        assert info is not None
        return info

    def describe(self, name: str, zone: str | None) -> ClusterInfo | None:
        lease = self._read().get(name)
        if lease is None:
            return None
        hosts = []
        for i, entry in enumerate(lease["hosts"]):
            user, host, port = _target(entry)
            hosts.append(ClusterHost(i, host, host, ssh_user=user, port=port))
        return ClusterInfo(
            name=name,
            cloud=self.name,
            zone=ZONE,
            accelerator=lease["accelerator"],
            state=READY,
            health="HEALTHY",
            hosts=hosts,
            labels=dict(lease.get("labels") or {}),
        )

    def list(self, zone: str | None = None) -> builtins.list[ClusterInfo]:
        return [i for n in sorted(self._read()) if (i := self.describe(n, ZONE)) is not None]

    def stop_refusal(self, spot: bool, accelerator: str | None = None) -> str | None:
        return "a pool lease cannot be stopped; `aios down` returns the machines to the pool"

    def stop(self, name: str, zone: str | None) -> None:
        raise CloudError(self.stop_refusal(False) or "", f"`aios down {name}`")

    def start(self, name: str, zone: str | None) -> ClusterInfo:
        info = self.describe(name, zone)
        if info is None:
            raise CloudError(f"cluster {name} holds no lease", "launch it again")
        return info

    def delete(self, name: str, zone: str | None) -> None:
        lease = self._read().get(name)
        if lease is None:
            return  # idempotent
        if lease.get("key"):
            for h in lease["hosts"]:
                with contextlib.suppress(CloudError):  # an unreachable machine keeps one line
                    self._ssh(h, _remove_key(name))
        with self._leases() as leases:
            leases.pop(name, None)

    # -------------------------------------------------------------- the machines' python
    def setup_commands(
        self, accelerator: str, requirements: builtins.list[str], backend: str | None = None
    ) -> builtins.list[str]:
        """The pool's machines are shared: aios never installs into their interpreter. Setup
        checks that ``python3`` has what the job needs and names what is missing (one line)."""
        check_requirements(requirements)
        if not requirements:
            return []
        find = (
            "import importlib.metadata as m, re, sys\n"
            "for r in sys.argv[1:]:\n"
            "    n = re.split(r'[<>=!~ ;\\[]', r, maxsplit=1)[0]\n"
            "    try: m.version(n)\n"
            "    except m.PackageNotFoundError: print(n)\n"
        )
        reqs = " ".join(shlex.quote(r) for r in requirements)
        return [
            f"missing=$(python3 -c {shlex.quote(find)} {reqs})",
            'if [ -n "$missing" ]; then echo "[aios] $(hostname): python3 lacks $(echo $missing);'
            ' install them there (aios never installs into a shared machine)"; exit 2; fi',
        ]

    # -------------------------------------------------------------- ssh with the pool's identity
    def _ssh_argv(self, entry: str, command: str) -> builtins.list[str]:
        user, host, port = _target(entry)
        argv = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new"]
        if self.settings.identity:  # the pool's admin key (a path, never its text)
            argv += ["-i", str(Path(self.settings.identity).expanduser())]
        return [*argv, "-p", str(port), f"{user}@{host}", command]

    def _ssh(self, entry: str, command: str, stdin: str | None = None) -> None:
        r = subprocess.run(
            self._ssh_argv(entry, command), input=stdin, text=True, capture_output=True, timeout=60
        )
        if r.returncode != 0:
            why = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
            raise CloudError(f"pool machine {entry}: {why}", "check that it is up and reachable")

    # -------------------------------------------------------------- dry run
    def render_create(self, request: ClusterRequest) -> builtins.list[CloudCommand]:
        taken = {h for lease in self._read().values() for h in lease["hosts"]}
        free = [h for h in self.settings.hosts if h not in taken][: request.nodes]
        cmds = [CloudCommand(["true"], f"lease {', '.join(free)} in {self.leases_path}")]
        cmds += [
            CloudCommand(
                self._ssh_argv(h, _add_key(request.name)),
                "add the cluster's public key (on stdin)",
            )
            for h in free
        ]
        return cmds

    def render(self, action: str, name: str, zone: str | None) -> builtins.list[CloudCommand]:
        lease = self._read().get(name)
        if lease is None or action not in ("delete", "describe"):
            return []
        if action == "describe":
            return [CloudCommand(["cat", str(self.leases_path)], f"the lease of {name}")]
        return [
            CloudCommand(self._ssh_argv(h, _remove_key(name)), "take the cluster's key back")
            for h in lease["hosts"]
        ]

    def describe_credentials(self) -> str:
        return "pool.identity" if self.settings.identity else "your SSH setup"


def _add_key(name: str) -> str:
    line = f'"$(cat) aios-pool-{name}"'
    return f"mkdir -p ~/.ssh && chmod 700 ~/.ssh && echo {line} >> ~/.ssh/authorized_keys"


def _remove_key(name: str) -> str:
    f = "~/.ssh/authorized_keys"
    mark = shlex.quote(f" aios-pool-{name}$")
    return f"[ -f {f} ] && grep -v {mark} {f} > {f}.aios; mv {f}.aios {f} 2>/dev/null; true"


__all__ = ["PoolProvider"]
