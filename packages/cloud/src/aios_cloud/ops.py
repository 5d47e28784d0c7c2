"""What the cloud commands do, independent of click: provision (with zone failover and cleanup),
code sync, setup, job start on every host from the backend's launch plan, the job watcher with
managed-spot recovery, and stop/start/down.

Remote layout on every host (under the login user's ``$HOME``)::

    ~/aios/<cluster>/code/            the synced working directory (jobs run here)
    ~/aios/<cluster>/setup.sha        hash of the setup script that last succeeded
    ~/aios/<cluster>/jobs/<id>/       run.sh, env (mode 600), pid, worker.log, exit_code,
                                      status/ (the runtime's per-rank ``preempted`` markers)

A job whose workers stopped for a preemption notice (the runtime writes ``status/rank<N>``
starting with ``preempted`` after its emergency checkpoint, then exits 75; torchrun reports 1
for the group) records exit code 75 (:data:`aios.preemption.EXIT_PREEMPTED`), and the watcher
treats it as a preemption, not a failure.

Jobs run detached (``setsid nohup``) so a dropped SSH connection never kills them; the watcher
polls ``exit_code``/``pid`` over SSH and the cloud's view of the cluster (preempted, unhealthy).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aios.contract import STATUS_DIR_ENV
from aios.errors import AiosError
from aios.preemption import EXIT_PREEMPTED

from aios_cloud.failover import create_with_failover, zone_order
from aios_cloud.provider import (
    PREEMPTED,
    READY,
    STOPPED,
    TERMINATED,
    CloudCommand,
    CloudError,
    CloudProvider,
    ClusterHost,
    ClusterInfo,
    ClusterNotFound,
    ClusterRequest,
)
from aios_cloud.ssh import (
    HostKeyChanged,
    HostResult,
    LinePrinter,
    SshError,
    SshRunner,
    _kill,
    _reap,
    _spawn,
)
from aios_cloud.store import (
    JOB_CANCELLED,
    JOB_FAILED,
    JOB_FINAL,
    JOB_PENDING,
    JOB_RECOVERING,
    JOB_RUNNING,
    JOB_SETTING_UP,
    JOB_SUCCEEDED,
    ClusterRecord,
    Store,
    cluster_dir,
)

Log = Callable[[str], None]


def remote_root(cluster: str) -> str:
    return f"$HOME/aios/{cluster}"


# ------------------------------------------------------------------------------ providers


def get_provider(cloud: str, config: Any) -> CloudProvider:
    from aios.plugins import get_registry

    spec = get_registry().cloud(cloud)
    return spec.factory(config)


def installed_clouds() -> list[str]:
    from aios.plugins import get_registry

    return sorted(get_registry().clouds)


# ------------------------------------------------------------------------------ job spec


@dataclass
class JobSpec:
    """What runs on the cluster. Stored in the job record (no secret values: ``forward_env``
    names variables whose values are read from the launching environment each time the job
    starts, and are written to a mode-600 file on the hosts, never into a command line)."""

    script: str
    args: list[str] = field(default_factory=list)
    module: bool = False
    backend: str = "cpu"
    python: str = "python3"
    env: dict[str, str] = field(default_factory=dict)
    forward_env: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    workdir: str = "."
    excludes: list[str] = field(default_factory=list)
    setup_lines: list[str] = field(default_factory=list)
    checkpoint_dir: str | None = None
    max_sync_mb: int = 512
    bundle: bool = True  # ship this aios (core + loaded plugins) in code/.aios-site

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobSpec:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def parse_env(items: list[str]) -> tuple[dict[str, str], list[str]]:
    """``--env K=V`` (plain values) and ``--env K`` (forward K from this environment). A value
    given inline for a secret-looking name is refused: it would land in the state database."""
    from aios.config import is_secret

    env: dict[str, str] = {}
    forward: list[str] = []
    for item in items:
        key, eq, value = item.partition("=")
        if not key or not key.replace("_", "a").isalnum() or key[0].isdigit():
            raise AiosError(
                f"--env '{item}' is not NAME=VALUE or NAME",
                "write e.g. --env LOG_LEVEL=debug or --env WANDB_API_KEY",
            )
        if not eq:
            forward.append(key)
        elif is_secret(key):
            raise AiosError(
                f"--env {key}=... puts a secret on the command line and in the aios state",
                f"export {key} in your shell and pass --env {key} to forward it",
            )
        else:
            env[key] = value
    return env, forward


# ------------------------------------------------------------------------------ cluster ops


def placeholder_hosts(n: int, user: str) -> list[ClusterHost]:
    return [
        ClusterHost(i, f"<worker-{i}-ip>", f"<worker-{i}-internal-ip>", ssh_user=user)
        for i in range(n)
    ]


def record_hosts(rec: ClusterRecord) -> list[ClusterHost]:
    out = []
    for h in rec.hosts:
        host = ClusterHost(
            **{k: v for k, v in h.items() if k in {f.name for f in dataclasses.fields(ClusterHost)}}
        )
        host.ssh_user = rec.ssh_user or host.ssh_user
        host.ssh_key = rec.ssh_key or host.ssh_key
        out.append(host)
    return sorted(out, key=lambda h: h.worker_id)


def cluster_key(name: str) -> Path:
    """The SSH key aios creates for cluster ``name`` when no ``--ssh-key`` is given: authorized
    on that cluster's hosts only, so its head host may hold a copy to reach the others."""
    return cluster_dir(name) / "id_ed25519"


def runner_for(
    rec: ClusterRecord, printer: Callable[[str, str], None] | None = None, **kw: Any
) -> SshRunner:
    return SshRunner(
        record_hosts(rec),
        cluster_dir(rec.name) / "known_hosts",
        key=rec.ssh_key,
        alias=f"aios-{rec.name}",
        printer=printer,
        **kw,
    )


def request_from_record(rec: ClusterRecord) -> ClusterRequest:
    names = {f.name for f in dataclasses.fields(ClusterRequest)}
    return ClusterRequest(**{k: v for k, v in rec.request.items() if k in names})


def save_hosts(
    store: Store, rec: ClusterRecord, info: ClusterInfo, provider: CloudProvider
) -> ClusterRecord:
    hosts = [dataclasses.asdict(h) for h in provider.hosts(info)]
    for h in hosts:
        h.pop("ssh_key", None)
    store.update_cluster(rec.name, hosts=hosts, zone=info.zone, state=info.state)
    new = store.get_cluster(rec.name)
    assert new is not None
    return new


def require_cluster(store: Store, name: str) -> ClusterRecord:
    rec = store.get_cluster(name)
    if rec is None:
        known = ", ".join(r.name for r in store.clusters()) or "none"
        raise ClusterNotFound(
            f"no cluster named '{name}' (known: {known})",
            "see `aios status`, or create it with `aios launch --name NAME`",
        )
    return rec


def provision(
    store: Store,
    provider: CloudProvider,
    request: ClusterRequest,
    ssh_key: str,
    log: Log,
    failover: bool = True,
    sleep: Callable[[float], None] = time.sleep,
    backoff: float = 2.0,
) -> ClusterRecord:
    """Claim the name, create with zone failover, record the hosts. On any failure nothing is
    left behind: every zone tried is cleaned up by the failover loop and the record removed."""
    request = provider.prepare(request)
    rec = ClusterRecord(
        name=request.name,
        cloud=provider.name,
        zone=request.zone,
        accelerator=request.accelerator,
        spot=request.spot,
        state="PENDING",
        request=_request_dict(request),
        ssh_user=request.ssh_user,
        ssh_key=ssh_key,
    )
    if not store.claim_cluster(rec):
        raise AiosError(
            f"a cluster named '{request.name}' already exists",
            f"use another --name, or `aios down {request.name}` first",
        )
    try:
        zones = zone_order(provider, request, pinned=not failover)
        result = create_with_failover(
            provider, request, zones, log=log, sleep=sleep, backoff=backoff
        )
        for a in result.attempts:
            store.event(request.name, "failover", f"{a.zone}: {a.kind}: {a.message[:200]}")
        store.event(
            request.name,
            "created",
            f"{result.info.accelerator} in {result.zone} ({len(result.info.hosts)} hosts)",
        )
        # a zone change must be remembered for later recreations
        req = dataclasses.replace(request, zone=result.zone)
        store.update_cluster(request.name, request=_request_dict(req))
        runner = SshRunner([], cluster_dir(request.name) / "known_hosts")
        runner.reset_host_keys()
        return save_hosts(store, store.get_cluster(request.name) or rec, result.info, provider)
    except BaseException as exc:
        leftover = getattr(exc, "aios_leftover_zone", None)
        if leftover:
            # the cloud side could not be cleaned up: keep the record so `aios down` finds it
            store.update_cluster(
                request.name,
                zone=leftover,
                state="LEFTOVER",
                request=_request_dict(dataclasses.replace(request, zone=leftover)),
            )
            store.event(
                request.name,
                "leftover",
                f"interrupted while creating in {leftover}; cleanup did not finish; `aios "
                f"down {request.name}` deletes it",
            )
        else:
            store.delete_cluster(request.name)
        raise


def _request_dict(request: ClusterRequest) -> dict[str, Any]:
    d = dataclasses.asdict(request)
    d.pop("ssh_public_key", None)  # public, but bulky; re-read from the key file when needed
    return d


def with_public_key(request: ClusterRequest, key: str) -> ClusterRequest:
    pub = Path(str(key) + ".pub")
    if not pub.is_file():
        raise AiosError(
            f"public key {pub} is missing next to the SSH key {key}",
            f"recreate it with `ssh-keygen -y -f {key} > {pub}`",
        )
    return dataclasses.replace(request, ssh_public_key=pub.read_text().strip())


# ------------------------------------------------------------------------------ the head host

HELPER_PYTHON = "python3"  # the hosts' system python runs fleet.py (before aios is there)
FAN_PARALLEL = 32  # hosts the head host drives at once


def _seconds(env: str, default: float) -> float:
    try:
        return float(os.environ.get(env, "") or default)
    except ValueError:
        return default


def reach_timeout() -> float:
    """How long a launch waits for every host to accept SSH (``AIOS_REACH_TIMEOUT``, 300 s)."""
    return _seconds("AIOS_REACH_TIMEOUT", 300.0)


def command_timeout() -> float:
    """Limit for one remote step on one host: code sync, job start, cancel
    (``AIOS_COMMAND_TIMEOUT``, 600 s)."""
    return _seconds("AIOS_COMMAND_TIMEOUT", 600.0)


def setup_timeout() -> float:
    """Limit for the setup script on one host (``AIOS_SETUP_TIMEOUT``, 3600 s)."""
    return _seconds("AIOS_SETUP_TIMEOUT", 3600.0)


class Head:
    """The launcher's one place to talk to: worker 0 of the cluster, over one reused SSH
    connection (ControlMaster) with this machine's agent forwarded. It runs
    :mod:`aios_cloud.fleet` there, which drives every other host over the cluster network
    (bounded pool, a timeout per host, progress lines), so what this machine sends and the
    connections it holds do not grow with the number of hosts."""

    def __init__(
        self,
        rec: ClusterRecord,
        printer: Callable[[str, str], None] | None = None,
        log: Log | None = None,
    ) -> None:
        self.rec = rec
        self.hosts = record_hosts(rec)
        if not self.hosts:
            raise SshError(f"cluster {rec.name} has no hosts recorded", "see `aios status`")
        self.head = self.hosts[0]
        self.labels = {h.worker_id: h.label for h in self.hosts}
        self.printer = printer
        self.log = log or (lambda m: None)
        self.root = remote_root(rec.name)
        self.helper: str | None = None
        own = cluster_key(rec.name)
        self.own_key = (
            own if rec.ssh_key and Path(rec.ssh_key).expanduser() == own and own.is_file() else None
        )
        self.runner = runner_for(
            rec, None, control=True, forward_agent=self.own_key is None, log=self.log
        )
        self.sent = 0  # payload bytes this machine sent to the head

    # -------------------------------------------------------------- plumbing
    def _call(
        self, cmd: str, payload: bytes, timeout: float, echo: bool = True
    ) -> tuple[HostResult, dict[int, tuple[int, str]], dict[int, list[str]], list[str]]:
        """Run ``cmd`` on the head with ``payload`` on stdin; returns the ssh result, the
        ``R`` lines (worker -> (rc, state)), the ``O`` lines per worker and other lines."""
        results: dict[int, tuple[int, str]] = {}
        outputs: dict[int, list[str]] = {}
        other: list[str] = []
        head_prefix = f"({self.head.label})"

        def parse(_prefix: str, line: str) -> None:
            tag, _, rest = line.partition(" ")
            if tag == "O":
                w, _, text = rest.partition(" ")
                if w.isdigit():
                    outputs.setdefault(int(w), []).append(text)
                    if echo and self.printer:
                        self.printer(f"({self.labels.get(int(w), 'worker ' + w)})", text)
                    return
            elif tag == "P":
                self.log(rest)
                return
            elif tag == "R":
                parts = rest.split(" ", 2)
                if len(parts) == 3 and parts[0].isdigit():
                    results[int(parts[0])] = (int(parts[1]), parts[2])
                    return
            other.append(line)
            if echo and self.printer and tag not in ("M", "OK", "NEED_HOSTS"):
                self.printer(head_prefix, line)

        self.runner.printer = parse
        fd, path = tempfile.mkstemp(prefix="aios-head-")
        try:
            with os.fdopen(fd, "wb") as f:  # mode 600: env files may hold forwarded secrets
                f.write(payload)
            self.sent += len(payload)
            # the head ends the command itself at the same limit: nothing stays behind there
            wrapped = f"timeout -k 5 {int(timeout) + 1} bash -c {shlex.quote(cmd)}"
            r = self.runner.run_one(self.head, wrapped, stdin_path=path, timeout=timeout)
        finally:
            os.unlink(path)
            self.runner.printer = None
        return r, results, outputs, other

    def _head_failed(self, r: HostResult, what: str) -> SshError:
        from aios_cloud.ssh import _first_line, _state_of

        detail = _first_line("\n".join(r.stderr[-5:])) or _state_of(r)
        return SshError(
            f"{what} failed on {self.head.label} (the head host: {detail})",
            "see the output above; rerun with --debug",
        )

    def ensure_helper(self) -> str:
        """Ship fleet.py to the head when its copy differs (a few KiB, once)."""
        if self.helper:
            return self.helper
        from aios_cloud import fleet

        src = Path(fleet.__file__).read_bytes()
        sha = hashlib.sha256(src).hexdigest()[:16]
        path = f"{self.root}/fleet/fleet-{sha}.py"
        r = self.runner.run_one(
            self.head,
            f"test -f {path} && echo have || echo need; "
            f"test -f {self.root}/fleet/id_ed25519 && echo key || true",
            stream=False,
            timeout=60,
        )
        if not r.ok:
            raise self._head_failed(r, "reaching the head host")
        if self.own_key and "key" not in r.stdout:
            # the cluster's own key (authorized on these hosts only): the head reaches the
            # others with it, no agent round trip through this machine per host
            pub = Path(str(self.own_key) + ".pub").read_text().strip()
            cmd = (
                f"set -e; mkdir -p {self.root}/fleet; umask 077; "
                f"cat > {self.root}/fleet/id_ed25519.tmp; "
                f"mv {self.root}/fleet/id_ed25519.tmp {self.root}/fleet/id_ed25519; "
                f"echo {shlex.quote(pub)} > {self.root}/fleet/id_ed25519.pub"
            )
            r2, *_ = self._call(cmd, Path(self.own_key).read_bytes(), timeout=60)
            if not r2.ok:
                raise self._head_failed(r2, "installing the cluster key")
        if "have" not in r.stdout:
            cmd = (
                f"set -e; mkdir -p {self.root}/fleet; rm -f {self.root}/fleet/fleet-*.py; "
                f"gzip -dc > {path}.tmp; mv {path}.tmp {path}"
            )
            r, *_ = self._call(cmd, gzip.compress(src, 9), timeout=120)
            if not r.ok:
                raise self._head_failed(r, "installing aios's helper")
        self.helper = path
        return path

    def _hosts_json(self, hosts: list[ClusterHost] | None = None) -> list[dict[str, Any]]:
        return [
            {"w": h.worker_id, "ip": h.internal_ip or h.ip, "port": h.port, "user": h.ssh_user}
            for h in (hosts or self.hosts)
        ]

    def fan(
        self,
        what: str,
        cmd: str | None = None,
        tasks: dict[int, tuple[str, str]] | None = None,
        timeout: float | None = None,
        retry_until: float = 0.0,
        install_key: bool = False,
        echo: bool = True,
        hosts: list[ClusterHost] | None = None,
        sub: str = "fan",
        send_hosts: bool = False,
    ) -> tuple[dict[int, tuple[int, str]], dict[int, list[str]]]:
        """Run ``cmd`` (or per-worker ``tasks``: worker -> (command, stdin text)) on every host
        through the head. Returns worker -> (exit code, state) and each worker's output lines.
        Raises :class:`SshError` when the head itself cannot be used."""
        helper = self.ensure_helper()
        hosts = hosts or self.hosts
        limit = command_timeout() if timeout is None else timeout
        every = self._hosts_json()
        ref = hashlib.sha256(json.dumps(every).encode()).hexdigest()[:16]
        req: dict[str, Any] = {
            "hosts_ref": ref,  # the head keeps the host list: polls do not resend it
            "self": self.head.worker_id,
            "what": what,
            "timeout": limit,
            "parallel": FAN_PARALLEL,
            "retry_until": retry_until,
            "install_key": install_key,
            # aios stopped/started or recreated the hosts: the head forgets the keys it pinned
            "reset_keys": getattr(self, "reset_keys", False) or self.runner.reset_marker.exists(),
            "python": HELPER_PYTHON,
        }
        if tasks is not None:
            req["tasks"] = {str(w): {"cmd": c, "stdin": i} for w, (c, i) in tasks.items()}
        else:
            req["cmd"] = cmd
            if len(hosts) != len(self.hosts):
                req["only"] = [h.worker_id for h in hosts]
        if send_hosts:  # reach, the first request of a launch, sends the host list
            req["hosts"] = every
        waves = -(-len(hosts) // FAN_PARALLEL)
        for _ in range(2):
            r, results, outputs, other = self._call(
                f"{HELPER_PYTHON} {helper} {sub} {self.root}",
                gzip.compress(json.dumps(req).encode(), 9),
                timeout=limit * (waves + 1) + retry_until + 60,
                echo=echo,
            )
            if r.returncode == 3 and "NEED_HOSTS" in other and "hosts" not in req:
                req["hosts"] = every
                continue
            break
        if r.ok and req["reset_keys"]:
            self.runner.reset_marker.unlink(missing_ok=True)
        if not r.ok or not results:
            raise self._head_failed(r, what)
        return results, outputs

    def check(
        self,
        results: dict[int, tuple[int, str]],
        what: str,
        outputs: dict[int, list[str]] | None = None,
    ) -> None:
        """Raise one line naming the hosts where ``what`` failed, each with its state and the
        last ``[aios]`` line it printed (the reason a setup check gave)."""
        bad = [(w, rc, st) for w, (rc, st) in sorted(results.items()) if rc != 0]
        if bad:

            def why(w: int, st: str) -> str:
                said = [ln for ln in (outputs or {}).get(w, []) if "[aios]" in ln]
                st = "no answer within the time limit" if st == "stalled" else st
                return f"{st}: {said[-1].split('[aios]', 1)[1].strip()}" if said else st

            names = "; ".join(f"worker {w}: {why(w, st)}" for w, _rc, st in bad[:5])
            more = f"; and {len(bad) - 5} more" if len(bad) > 5 else ""
            raise SshError(
                f"{what} failed on {len(bad)} of {len(results)} hosts ({names}{more})",
                "see the output above; rerun with --debug",
            )

    # -------------------------------------------------------------- phases
    def reach(self, timeout: float | None = None) -> None:
        """Wait for the head (from here), then for every other host (from the head, which
        installs its own key there through the forwarded agent the first time)."""
        limit = reach_timeout() if timeout is None else timeout
        start = time.monotonic()
        marker = self.runner.reset_marker
        self.reset_keys = marker.exists() or not self.runner.known_hosts.exists()
        self.runner.wait_reachable(limit, hosts=[self.head])
        self.ensure_helper()
        if len(self.hosts) == 1:
            marker.unlink(missing_ok=True)
            return
        left = max(5.0, limit - (time.monotonic() - start))
        results, _ = self.fan(
            "reachable",
            cmd="true",
            timeout=self.runner.connect_timeout + 20,
            retry_until=left,
            install_key=self.own_key is None,
            echo=False,
            send_hosts=True,
        )
        bad = [(w, st) for w, (rc, st) in sorted(results.items()) if rc != 0]
        if bad:
            names = ", ".join(f"worker {w} ({st})" for w, st in bad[:5])
            more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
            raise SshError(
                f"{len(bad)} of {len(results)} hosts not reachable from the head host after "
                f"{limit:.0f}s: {names}{more}",
                "check that those hosts are up and accept SSH on the cluster network",
            )
        marker.unlink(missing_ok=True)

    def sync(self, manifest: Any) -> tuple[int, int]:
        """Send the code to the head (only the blobs it lacks) and have it copy the code to
        every other host. Returns (bytes sent from here, blobs sent)."""
        helper = self.ensure_helper()
        before = self.sent
        payload = manifest.payload()
        r, _, _, other = self._call(
            f"{HELPER_PYTHON} {helper} have {self.root}",
            payload,
            timeout=command_timeout(),
            echo=False,
        )
        if not r.ok:
            raise self._head_failed(r, "code sync")
        missing = [ln.split()[1] for ln in other if ln.startswith("M ")]
        r, *_ = self._call(
            f"{HELPER_PYTHON} {helper} put {self.root}",
            manifest.blob_tar(missing) if missing else b"",
            timeout=command_timeout(),
        )
        if not r.ok:
            raise self._head_failed(r, "code sync")
        if len(self.hosts) > 1:
            results, _ = self.fan("synced", sub="sync", echo=True)
            self.check(results, "code sync")
        return self.sent - before, len(missing)


def run_via_head(
    rec: ClusterRecord,
    cmd: str,
    hosts: list[ClusterHost],
    printer: Callable[[str, str], None],
    timeout: float | None = None,
) -> list[int]:
    """``cmd`` on ``hosts`` through the head host (``aios exec``, ``aios logs``); straight
    from here (bounded, timed) when the head cannot be used. Exit codes in worker order."""
    try:
        results, _ = Head(rec, printer).fan("done", cmd=cmd, hosts=hosts, timeout=timeout)
        return [results.get(h.worker_id, (255, ""))[0] for h in hosts]
    except SshError as exc:
        printer("[aios]", f"{exc.message}; asking the hosts directly")
        runner = runner_for(rec, printer)
        return [r.returncode for r in runner.run(cmd, hosts=hosts, timeout=timeout)]


def reach(rec: ClusterRecord, printer: Callable[[str, str], None] | None, log: Log) -> None:
    """Wait until every host of ``rec`` answers (see :meth:`Head.reach`)."""
    Head(rec, printer, log).reach()


def sync_code(
    rec: ClusterRecord, spec: JobSpec, printer: Callable[[str, str], None] | None, log: Log
) -> None:
    """Ship the workdir (and aios itself) to every host: the head host gets only the content
    it does not already have; it copies the code to the other hosts over the cluster network."""
    from aios_cloud.codesync import make_manifest, secret_files

    extra: list = []
    generated: dict[str, str] = {}
    if spec.bundle:
        from aios_cloud.bundle import build

        b = build(spec.backend, rec.cloud)
        extra, generated = b.files, b.generated
    manifest = make_manifest(
        spec.workdir,
        spec.excludes,
        spec.max_sync_mb * 2**20,
        extra_files=extra,
        generated=generated,
    )
    secrets = secret_files(spec.workdir, spec.excludes)
    if secrets:
        log(
            f"left out {len(secrets)} secret-looking files "
            f"({', '.join(secrets[:5])}{', ...' if len(secrets) > 5 else ''}); "
            "pass values with --env NAME instead"
        )
    head = Head(rec, printer, log)
    sent, blobs = head.sync(manifest)
    n = len(rec.hosts)
    log(
        f"code sync: {manifest.files} files ({manifest.bytes / 1024:.0f} KiB) from "
        f"{os.path.abspath(spec.workdir)}"
        + (f" + aios itself ({len(extra) + len(generated)} files)" if extra else "")
        + f"; sent {_size(sent)} ({blobs} changed of {len(manifest.blobs)} blobs) to worker 0"
        + (
            f", which copied the changes to {n - 1} other hosts over the cluster network"
            if n > 1
            else ""
        )
    )


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


def setup_script(spec: JobSpec) -> str:
    return "\n".join(["set -euo pipefail", *spec.setup_lines, ""])


def run_setup(
    rec: ClusterRecord,
    spec: JobSpec,
    printer: Callable[[str, str], None] | None,
    log: Log,
    force: bool = False,
) -> bool:
    """Run the setup script on every host, unless it already succeeded there (same hash).
    Returns whether it ran anywhere."""
    if not spec.setup_lines:
        return False
    script = setup_script(spec)
    sha = hashlib.sha256(script.encode()).hexdigest()[:16]
    root = remote_root(rec.name)
    marker = f"{root}/setup.sha"
    log(f"setup on {len(rec.hosts)} hosts ({len(spec.setup_lines)} steps)")
    cmd = (
        f'if [ "$(cat {marker} 2>/dev/null)" = {sha} ] && [ {int(force)} = 0 ]; then echo '
        "'[aios] setup already done'; exit 0; fi; "
        f"cd {root}/code && bash -c {shlex.quote(script)} && echo {sha} > {marker}"
    )
    head = Head(rec, printer, log)
    results, outputs = head.fan("set up", cmd=cmd, timeout=setup_timeout())
    head.check(results, "setup", outputs)
    return True


def host_commands(
    rec: ClusterRecord, spec: JobSpec, config: Any, accelerator: str | None = None
) -> dict[int, Any]:
    """The backend's launch plan for the cluster's hosts: worker id -> HostPlan (env + argv),
    with the local interpreter replaced by the remote one."""
    from aios.plugins import get_registry
    from aios.types import Host, LaunchRequest

    hosts = record_hosts(rec)
    per_host = sorted({int(h["nprocs"]) for h in rec.hosts if h.get("nprocs")})
    if per_host:  # the provider counted each host's devices (the ssh cloud; --nprocs-per-host):
        # the plan needs no instance type
        config = config.model_copy(update={"nprocs": per_host[0]})
    req = LaunchRequest(
        script=spec.script,
        args=list(spec.args),
        module=spec.module,
        hosts=[Host(h.ip, h.internal_ip or h.ip, h.worker_id) for h in hosts],
        accelerator=None if per_host else (accelerator or rec.accelerator),
        python=spec.python,
    )
    reg = get_registry()
    plan = reg.call_first("aios_launch_plan", backend=spec.backend, config=config, request=req)
    if plan is None:
        raise AiosError(
            f"backend '{spec.backend}' gave no launch plan",
            f"install the plugin for '{spec.backend}' (see `aios plugins`)",
        )
    out = {}
    for hp in plan.hosts:
        # plans from plugins that build their own command (not elastic_plan) may still name
        # this machine's interpreter
        hp.command = [spec.python if c == sys.executable else c for c in hp.command]
        out[hp.host.worker_id] = hp
    return out


def job_env(
    spec: JobSpec, provider_env: dict[str, str], environ: dict[str, str] | None = None
) -> dict[str, str]:
    """Environment for every host (plan env comes on top). Forwarded values are read now."""
    environ = os.environ if environ is None else environ
    env = dict(provider_env)
    env.update(spec.env)
    if spec.checkpoint_dir:
        env["AIOS_CHECKPOINT__DIR"] = spec.checkpoint_dir
    for name in spec.forward_env:
        if name not in environ:
            raise AiosError(
                f"--env {name} asks to forward {name}, which is not set here",
                f"export {name} first",
            )
        env[name] = environ[name]
    return env


def shell_word(word: str) -> str:
    """``word`` quoted for the hosts' shell, a leading ``~/`` left to expand to the host's home
    (a quoted ``'~/x'`` never expands): ``~/.aios/venv/bin/python`` -> ``~/'.aios/venv/bin/python'``."""
    if word.startswith("~/") and len(word) > 2:
        return "~/" + shlex.quote(word[2:])
    return shlex.quote(word)


def render_run_sh(rec: ClusterRecord, job_id: int, plan: Any, bundle: bool = False) -> str:
    root = remote_root(rec.name)
    d = f"{root}/jobs/{job_id}"
    cmd = " ".join(shell_word(c) for c in plan.command)
    site = (
        [f'export PYTHONPATH="{root}/code/.aios-site${{PYTHONPATH:+:$PYTHONPATH}}"']
        if bundle
        else []
    )
    return "\n".join(
        [
            "#!/bin/bash",
            f'D="{d}"',
            'set -a; [ -f "$D/env" ] && . "$D/env"; set +a',
            # stdout is a file here: keep Python (the launcher's tee included) line-buffered so
            # `aios logs -f` is live
            "export PYTHONUNBUFFERED=1",
            *site,
            # the runtime marks ranks that stopped for a preemption notice here (after the emergency
            # checkpoint); torchrun then reports exit 1 for the whole group
            'mkdir -p "$D/status"',
            # the cluster's job queue: wait (marked queued) until every earlier job on this host ended
            'touch "$D/queued"',
            f'for j in $(ls -1 "{root}/jobs" 2>/dev/null | sort -n); do case "$j" in *[!0-9]*) continue;; esac; '
            f'[ "$j" -lt {job_id} ] || continue; P="{root}/jobs/$j"; '
            'while [ ! -f "$P/exit_code" ] && [ -f "$P/pid" ] && kill -0 "$(cat "$P/pid")" '
            "2>/dev/null; do sleep 1; done; done",
            'rm -f "$D/queued"',
            f'export {STATUS_DIR_ENV}="$D/status"',
            f'cd "{root}/code" || exit 97',
            cmd,
            "rc=$?",
            'if [ $rc -ne 0 ] && grep -qs "^preempted" "$D"/status/rank*; then echo "[aios] '
            'workers stopped for a preemption notice (launcher exit $rc)"; '
            f"rc={EXIT_PREEMPTED}; fi",
            # aios's watchdog (beside the launcher, started by local rank 0) stopped a hung run
            'if [ $rc -ne 0 ] && [ -f "$D/status/hung" ]; then echo "[aios] the watchdog stopped '
            'a hung run (launcher exit $rc)"; rc=124; fi',
            'echo $rc > "$D/exit_code.tmp" && mv "$D/exit_code.tmp" "$D/exit_code"',
            "exit $rc",
            "",
        ]
    )


def env_file(env: dict[str, str]) -> str:
    """``export K=V`` lines; a value starting with ``~/`` expands to the host's home."""
    lines = []
    for k, v in sorted(env.items()):
        if v.startswith("~/"):
            rest = (
                v[2:]
                .replace("\\", "\\\\")
                .replace('"', '\\"')
                .replace("$", "\\$")
                .replace("`", "\\`")
            )
            lines.append(f'export {k}="$HOME/{rest}"\n')
        else:
            lines.append(f"export {k}={shlex.quote(v)}\n")
    return "".join(lines)


def start_job(
    rec: ClusterRecord,
    job_id: int,
    spec: JobSpec,
    config: Any,
    provider_env: dict[str, str],
    printer: Callable[[str, str], None] | None,
    log: Log,
) -> None:
    """Write run.sh and env on every host and start it detached."""
    plans = host_commands(rec, spec, config)
    base_env = job_env(spec, provider_env)
    root = remote_root(rec.name)
    d = f"{root}/jobs/{job_id}"
    tasks = {}
    for wid, plan in plans.items():
        run_sh = render_run_sh(rec, job_id, plan, bundle=spec.bundle)
        cmd = (
            f"set -e; rm -rf {d}; mkdir -p {d}; umask 077; cat > {d}/env; "
            f"printf %s {shlex.quote(run_sh)} > {d}/run.sh; chmod 700 {d}/run.sh; "
            f"setsid nohup bash {d}/run.sh > {d}/worker.log 2>&1 < /dev/null & echo $! > {d}/pid; echo started"
        )
        # each host's env (with forwarded values) travels on stdin, never on a command line
        tasks[wid] = (cmd, env_file({**base_env, **plan.env}))
    head = Head(rec, printer, log)
    results, _ = head.fan("started", tasks=tasks, echo=False)
    head.check(results, "job start")
    log(f"job {job_id} started on {len(plans)} hosts")


def poll_job(rec: ClusterRecord, job_id: int) -> list[tuple[str, int | None]]:
    """Per host (worker order): ``("EXIT", code)``, ``("RUNNING", None)``, ``("LOST", None)``
    (no process and no exit code: the host rebooted or was replaced), ``("REPLACED", None)``
    (a different machine answers at the host's address: its host key changed) or
    ``("UNREACHABLE", None)``. Never raises for one host's SSH trouble."""
    d = f"{remote_root(rec.name)}/jobs/{job_id}"
    cmd = (
        f'if [ -f {d}/exit_code ]; then echo "EXIT $(cat {d}/exit_code)"; '
        f'elif [ -f {d}/pid ] && kill -0 "$(cat {d}/pid)" 2>/dev/null; then if [ -f '
        f"{d}/queued ]; then echo QUEUED; else echo RUNNING; fi; "
        f"else echo LOST; fi"
    )
    hosts = record_hosts(rec)
    if not hosts:
        return []
    try:
        results, outputs = Head(rec).fan("polled", cmd=cmd, timeout=60, echo=False)
    except HostKeyChanged:
        return [("REPLACED", None)] + [("UNREACHABLE", None)] * (len(hosts) - 1)
    except SshError:
        return [("UNREACHABLE", None)] * len(hosts)
    out: list[tuple[str, int | None]] = []
    for h in hosts:
        rc, st = results.get(h.worker_id, (255, "missing"))
        lines = outputs.get(h.worker_id) or []
        words = (lines[-1] if lines else "").split()
        if st == "replaced":
            out.append(("REPLACED", None))
        elif rc != 0 or not words:
            out.append(("UNREACHABLE", None))
        elif words[0] == "EXIT":
            out.append(
                ("EXIT", int(words[1]) if len(words) > 1 and words[1].lstrip("-").isdigit() else 1)
            )
        else:
            out.append((words[0], None))
    return out


def cancel_job(rec: ClusterRecord, job_id: int, grace: float = 10.0) -> None:
    d = f"{remote_root(rec.name)}/jobs/{job_id}"
    cmd = (
        f"[ -f {d}/pid ] || exit 0; p=$(cat {d}/pid); kill -TERM -- -$p 2>/dev/null || true; "
        f"for i in $(seq {int(grace * 10)}); do kill -0 $p 2>/dev/null || exit 0; sleep 0.1; "
        "done; kill -KILL -- -$p 2>/dev/null || true"
    )
    hosts = record_hosts(rec)
    try:
        results, _ = Head(rec).fan("cancelled", cmd=cmd, timeout=grace + 30, echo=False)
        left = [h for h in hosts if results.get(h.worker_id, (1, ""))[0] != 0]
        if not left:
            return
        hosts = [h for h in left if h.worker_id != hosts[0].worker_id]
    except SshError:  # the head is gone: ask the other hosts directly (bounded, timed)
        hosts = hosts[1:]
    if not hosts:
        return
    direct = runner_for(rec, None, retries=1, backoff=0.5)
    try:
        direct.run(cmd, stream=False, timeout=grace + 30, hosts=hosts)
    except SshError:  # a replaced/unreachable host has no job left to cancel
        pass


class LogFollower:
    """Every host's worker.log, each line prefixed, until :meth:`stop`: one ssh to the head
    host, which follows the other hosts over the cluster network."""

    def __init__(
        self,
        rec: ClusterRecord,
        job_id: int,
        printer: Callable[[str, str], None],
        from_start: bool = True,
        workers: list[int] | None = None,
    ) -> None:
        head = Head(rec)
        helper = head.ensure_helper()
        d = f"{remote_root(rec.name)}/jobs/{job_id}"
        req = {
            "hosts": head._hosts_json(
                [h for h in head.hosts if workers is None or h.worker_id in workers]
            ),
            "self": head.head.worker_id,
            "jobdir": d,
            "from_start": from_start,
        }
        argv = head.runner.argv(head.head, f"{HELPER_PYTHON} {helper} tail {head.root}")
        self.proc = _spawn(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            errors="replace",
            bufsize=1,
            env=head.runner._env(),
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        self.thread = threading.Thread(
            target=self._pump, args=(self.proc, head.labels, printer), daemon=True
        )
        self.thread.start()

    @staticmethod
    def _pump(
        p: subprocess.Popen, labels: dict[int, str], printer: Callable[[str, str], None]
    ) -> None:
        assert p.stdout is not None
        for line in p.stdout:
            tag, _, rest = line.rstrip("\n").partition(" ")
            w, _, text = rest.partition(" ")
            if tag == "O" and w.isdigit():
                printer(f"({labels.get(int(w), 'worker ' + w)})", text)

    def stop(self, drain: float = 1.0) -> None:
        time.sleep(drain)
        p = self.proc
        if p.poll() is None:
            try:
                assert p.stdin is not None
                p.stdin.close()  # the head's follower ends when its stdin closes
            except OSError:
                pass
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                _kill(p)
                p.wait()
        _reap(p)
        self.thread.join(2)


# ------------------------------------------------------------------------------ the watcher


@dataclass
class WatchOptions:
    poll: float = 5.0
    describe_every: float = 15.0
    lost_after: int = 3
    straggler_grace: float = 60.0
    follow: bool = True
    ssh_timeout: float = 300.0


class Watcher:
    """Watches one job to the end; on preemption/unhealthy/lost hosts it recovers (managed runs)
    up to ``max_restarts`` times: repair or recreate the cluster (zone failover), re-sync code,
    re-run setup, restart the job (which resumes from the newest complete checkpoint)."""

    def __init__(
        self,
        store: Store,
        provider: CloudProvider,
        job_id: int,
        config: Any,
        printer: Callable[[str, str], None] | None = None,
        log: Log | None = None,
        options: WatchOptions | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.store = store
        self.provider = provider
        self.job_id = job_id
        self.config = config
        self.printer = printer or LinePrinter()
        self.log = log or (lambda m: self.printer("[aios]", m))
        self.opt = options or WatchOptions()
        self.sleep = sleep
        self.follower: LogFollower | None = None
        self._maintenance_logged = False

    # -------------------------------------------------------------- helpers
    def _job(self):
        job = self.store.get_job(self.job_id)
        if job is None:
            raise AiosError(f"job {self.job_id} does not exist", "see `aios status`")
        return job

    def _follow(self, rec: ClusterRecord) -> None:
        if self.opt.follow:
            self._unfollow()
            self.follower = LogFollower(rec, self.job_id, self.printer)

    def _unfollow(self) -> None:
        if self.follower:
            self.follower.stop()
            self.follower = None

    # -------------------------------------------------------------- main loop
    def run(self) -> int:
        """Returns the job's exit status (0 success)."""
        rec = self.store.get_cluster(self._job().cluster)
        if rec is None:
            return self._finish(JOB_CANCELLED, None, "cluster was deleted")
        self.store.update_job(self.job_id, watcher_pid=os.getpid())
        self._follow(rec)
        try:
            return self._loop()
        finally:
            self._unfollow()

    def _loop(self) -> int:
        lost_count = 0
        last_describe = 0.0
        first_nonzero: float | None = None
        while True:
            job = self._job()
            if job.state in JOB_FINAL:
                return 0 if job.state == JOB_SUCCEEDED else 1
            rec = self.store.get_cluster(job.cluster)
            if rec is None:
                return self._finish(JOB_CANCELLED, None, "cluster was deleted")
            try:
                states = poll_job(rec, self.job_id)
            except SshError as exc:  # defensive: poll_job maps per-host SSH trouble itself
                self.log(f"polling {rec.name} failed ({exc}); retrying")
                states = [("UNREACHABLE", None)] * max(1, len(rec.hosts))
            incident = None
            maintenance = False
            now = time.monotonic()
            queued = bool(states) and all(s == "QUEUED" for s, _ in states)
            if queued != (job.state == JOB_PENDING):
                # waiting in the cluster's queue behind an earlier job
                self.store.update_job(self.job_id, state=JOB_PENDING if queued else JOB_RUNNING)
            states = [("RUNNING" if s == "QUEUED" else s, c) for s, c in states]
            need_describe = now - last_describe >= self.opt.describe_every or any(
                s != "RUNNING" for s, _ in states
            )
            if need_describe:
                last_describe = now
                try:
                    info = self.provider.describe(rec.name, rec.zone)
                except CloudError as exc:  # the API hiccuped: look again at the next poll
                    self.log(f"describe {rec.name} failed ({exc}); retrying")
                    self.sleep(self.opt.poll)
                    continue
                if info is None:
                    incident = "cluster disappeared"
                elif info.preempted or info.state in (TERMINATED,):
                    incident = "preempted"
                elif info.state == STOPPED:
                    incident = "stopped"
                elif info.unhealthy:
                    incident = f"unhealthy ({info.health_detail or info.health})"
                elif info.in_maintenance:
                    # the cloud maintains the hosts and they come back by themselves: wait
                    maintenance = True
                    if not self._maintenance_logged:
                        self.log(
                            f"cluster {rec.name}: in host maintenance "
                            f"({info.health_detail or 'maintenance'}); waiting for it to end"
                        )
                        self.store.event(
                            rec.name,
                            "maintenance",
                            f"job {self.job_id}: {info.health_detail or 'maintenance'}",
                            self.job_id,
                        )
                        self._maintenance_logged = True
                else:
                    self._maintenance_logged = False
            if incident is None and any(s == "REPLACED" for s, _ in states):
                # a new machine answers at a host's address (new host key): the cloud replaced
                # it (spot reclaim and relaunch, maintenance); the job is gone with the old one
                which = ", ".join(
                    f"worker {i}" for i, (s, _) in enumerate(states) if s == "REPLACED"
                )
                incident = f"hosts replaced ({which}: new host key)"
            if incident is None and any(s == "EXIT" and c == EXIT_PREEMPTED for s, c in states):
                # workers checkpointed and stopped for a spot/preemption notice; the cloud may
                # still report the machines running (EC2 gives 2 minutes)
                which = ", ".join(
                    f"worker {i}"
                    for i, (s, c) in enumerate(states)
                    if s == "EXIT" and c == EXIT_PREEMPTED
                )
                incident = f"preempted (workers stopped for a preemption notice: {which})"
            if incident is None:
                codes = [c for s, c in states if s == "EXIT"]
                if len(codes) == len(states):
                    if all(c == 0 for c in codes):
                        return self._finish(JOB_SUCCEEDED, codes, "all workers exited 0")
                    return self._finish(JOB_FAILED, codes, f"worker exit codes {codes}")
                if any(c != 0 for c in codes):
                    first_nonzero = first_nonzero or now
                    if now - first_nonzero > self.opt.straggler_grace:
                        cancel_job(rec, self.job_id)
                        return self._finish(
                            JOB_FAILED,
                            [c if s == "EXIT" else -9 for s, c in states],
                            "a worker failed; the others were stopped",
                        )
                if maintenance:
                    lost_count = 0
                elif any(s in ("LOST", "UNREACHABLE") for s, _ in states):
                    lost_count += 1
                    if lost_count >= self.opt.lost_after:
                        incident = (
                            "hosts lost ("
                            + ", ".join(
                                f"worker {i}: {s.lower()}"
                                for i, (s, _) in enumerate(states)
                                if s != "RUNNING" and s != "EXIT"
                            )
                            + ")"
                        )
                else:
                    lost_count = 0
            if incident is not None:
                code = self._incident(job, rec, incident)
                if code is not None:
                    return code
                lost_count = 0
                first_nonzero = None
                last_describe = 0.0
                continue
            self.sleep(self.opt.poll)

    def _finish(self, state: str, codes: list[int] | None, why: str) -> int:
        job = self.store.get_job(self.job_id)
        self.store.update_job(self.job_id, state=state, exit_codes=codes, watcher_pid=None)
        if job:
            self.store.event(
                job.cluster, "job-" + state.lower(), f"job {self.job_id}: {why}", self.job_id
            )
        self.log(f"job {self.job_id} {state.lower()}: {why}")
        if state == JOB_SUCCEEDED:
            return 0
        if codes:
            bad = [c for c in codes if c != 0]
            return bad[0] if bad and 0 < bad[0] < 256 else 1
        return 1

    def _incident(self, job, rec: ClusterRecord, incident: str) -> int | None:
        self._unfollow()
        kind = (
            "preempted"
            if (
                incident in ("stopped", "cluster disappeared")
                or incident.startswith(("preempted", "hosts lost", "hosts replaced"))
            )
            else "unhealthy"
        )
        self.store.event(rec.name, kind, f"job {self.job_id}: {incident}", self.job_id)
        self.log(f"cluster {rec.name}: {incident}")
        if not job.managed or job.restarts >= job.max_restarts:
            # nothing works unwatched: what still runs on the healthy hosts is stopped
            self.log(f"stopping job {self.job_id} on the remaining hosts of {rec.name}")
            cancel_job(rec, self.job_id)
            if not job.managed:
                why = (
                    f"{incident}; the job was stopped on the other hosts; relaunch with --spot "
                    "--max-restarts N to recover automatically"
                )
                return self._finish(JOB_FAILED, None, why)
            return self._finish(
                JOB_FAILED,
                None,
                f"{incident}; the {job.max_restarts} restarts allowed are used up; the job was "
                "stopped on the other hosts",
            )
        self.log(f"managed recovery takes over (restarts used {job.restarts}/{job.max_restarts})")
        n = self.store.bump_restarts(self.job_id)
        self.store.update_job(self.job_id, state=JOB_RECOVERING)
        self.log(f"recovery {n}/{job.max_restarts}: {incident}")
        try:
            autostop = autostop_of(rec)
            action, rec = self._recover_cluster(rec, incident)
            spec = JobSpec.from_dict(job.spec)
            self.store.update_job(self.job_id, state=JOB_SETTING_UP)
            Head(rec, self.printer, self.log).reach(self.opt.ssh_timeout)
            sync_code(rec, spec, self.printer, self.log)
            run_setup(rec, spec, self.printer, self.log)
            start_job(
                rec,
                self.job_id,
                spec,
                self.config,
                self.provider.remote_env(
                    self.provider.describe(rec.name, rec.zone) or _info_from(rec)
                ),
                self.printer,
                self.log,
            )
            self.store.update_job(self.job_id, state=JOB_RUNNING)
            # the recreated (or restarted) head host has no agent: install it again
            reinstall_agent(self.store, self.provider, rec, self.printer, self.log, autostop)
            self.store.event(
                rec.name,
                "recovered",
                f"recovery {n}/{job.max_restarts}: {action} in {rec.zone} after {incident}; "
                f"job {self.job_id} restarted (resumes from the newest checkpoint)",
                self.job_id,
            )
            self.log(f"recovery {n}/{job.max_restarts} done: {action} in {rec.zone}")
            self._follow(rec)
            return None
        except AiosError as exc:
            self.store.event(rec.name, "recovery-failed", f"recovery {n}: {exc}", self.job_id)
            self.log(f"recovery {n} failed: {exc}")
            if self.store.get_job(self.job_id).restarts < job.max_restarts:  # type: ignore[union-attr]
                self.sleep(self.opt.poll)
                return None  # the loop notices the still-broken cluster and tries again
            return self._finish(JOB_FAILED, None, f"recovery failed: {exc}")

    def _recover_cluster(self, rec: ClusterRecord, incident: str) -> tuple[str, ClusterRecord]:
        provider = self.provider
        runner = runner_for(rec)
        # a user's own host (--cloud ssh) with a new key is never trusted: its provider's
        # create checks the pinned keys and fails the recovery with one line
        if incident.startswith("hosts replaced") and not getattr(provider, "user_hosts", False):
            # trust the new host keys only when the cloud itself says the cluster is up
            info = provider.describe(rec.name, rec.zone)
            if info is not None and info.ready and not info.unhealthy and not info.preempted:
                runner.reset_host_keys()
                return "reconnected to the replaced hosts", save_hosts(
                    self.store, rec, info, provider
                )
            self.log(
                f"{rec.name} is {info.state if info else 'gone'} after its hosts were replaced; recreating"
            )
        if incident.startswith("unhealthy") or incident == "stopped":
            info = provider.describe(rec.name, rec.zone)
            if info is not None:
                try:
                    if incident == "stopped":
                        info = provider.start(rec.name, rec.zone)
                        action = "started"
                    else:
                        action = provider.repair(info)
                        info = provider.describe(rec.name, rec.zone)
                    if info is not None and info.ready and not info.unhealthy:
                        runner.reset_host_keys()
                        return action, save_hosts(self.store, rec, info, provider)
                    self.log(f"{action} did not make {rec.name} healthy; recreating")
                except CloudError as exc:
                    self.log(f"repair failed ({exc}); recreating")
        # recreate (same zone first, then the others offering the type)
        provider.delete(rec.name, rec.zone)
        request = request_from_record(rec)
        request = with_public_key(request, rec.ssh_key) if rec.ssh_key else request
        zones = zone_order(provider, request, pinned=False)
        result = create_with_failover(
            provider,
            request,
            zones,
            log=self.log,
            sleep=self.sleep,
            backoff=min(2.0, self.opt.poll),
        )
        for a in result.attempts:
            self.store.event(
                rec.name, "failover", f"{a.zone}: {a.kind}: {a.message[:200]}", self.job_id
            )
        runner.reset_host_keys()
        if result.zone != rec.zone:
            self.store.update_cluster(
                rec.name, request=_request_dict(dataclasses.replace(request, zone=result.zone))
            )
        new = save_hosts(self.store, rec, result.info, provider)
        moved = f" (moved from {rec.zone})" if result.zone != rec.zone else ""
        return f"recreated{moved}", new


def _info_from(rec: ClusterRecord) -> ClusterInfo:
    return ClusterInfo(
        rec.name, rec.cloud, rec.zone, rec.accelerator, READY, hosts=record_hosts(rec)
    )


# ------------------------------------------------------------------------------ lifecycle


def stop_cluster(store: Store, provider: CloudProvider, rec: ClusterRecord) -> None:
    provider.stop(rec.name, rec.zone)
    store.update_cluster(rec.name, state=STOPPED)
    store.event(rec.name, "stopped", "stopped by the user")


def start_cluster(
    store: Store, provider: CloudProvider, rec: ClusterRecord, log: Log | None = None
) -> ClusterRecord:
    info = provider.start(rec.name, rec.zone)
    runner_for(rec).reset_host_keys()  # a stopped/started VM comes back with new host keys
    store.event(rec.name, "started", "started by the user")
    new = save_hosts(store, rec, info, provider)
    reinstall_agent(store, provider, new, None, log or (lambda m: None))
    return new


def autostop_of(rec: ClusterRecord) -> dict[str, Any] | None:
    """The cluster's autostop setting (kept in its record), or None."""
    return rec.request.get("autostop") or None


def remember_autostop(store: Store, name: str, autostop: dict[str, Any] | None) -> None:
    """Keep (or, with None, forget) the autostop setting in the record, so the agent is
    installed again after a managed recovery and after `aios start`."""
    rec = store.get_cluster(name)
    if rec is not None:
        request = {k: v for k, v in rec.request.items() if k != "autostop"}
        if autostop:
            request["autostop"] = autostop
        store.update_cluster(name, request=request)


def reinstall_agent(
    store: Store,
    provider: CloudProvider,
    rec: ClusterRecord,
    printer: Callable[[str, str], None] | None,
    log: Log,
    autostop: dict[str, Any] | None = None,
) -> None:
    """Install the autostop agent again where the cluster has an autostop setting (``autostop``,
    else the record's): a recreated cluster has a fresh head host, a started one lost its
    processes. Without this the cluster bills on with nothing to stop it."""
    cfg = autostop or autostop_of(rec)
    if not cfg:
        return
    remember_autostop(store, rec.name, cfg)
    install_agent(
        rec, provider, cfg["idle_seconds"], cfg["action"], cfg["python"], printer, log, cfg["poll"]
    )
    store.event(rec.name, "autostop", f"agent installed on worker 0 ({cfg['action']} when idle)")


def down_cluster(store: Store, provider: CloudProvider, rec: ClusterRecord) -> None:
    for job in store.jobs(rec.name):
        if job.state not in JOB_FINAL:
            store.update_job(job.id, state=JOB_CANCELLED)
    provider.delete(rec.name, rec.zone)
    store.delete_cluster(rec.name)
    runner_for(rec).reset_host_keys()


def install_agent(
    rec: ClusterRecord,
    provider: CloudProvider,
    idle_seconds: float,
    action: str,
    python: str,
    printer: Callable[[str, str], None] | None,
    log: Log,
    poll: float = 30.0,
) -> None:
    """Start the autostop/autodown agent (:mod:`aios_cloud.agent`) on the head host, replacing
    one already running there. It needs the shipped aios (code/.aios-site) or an installed one."""
    import json

    why = provider.stop_refusal(rec.spot, rec.accelerator) if action == "stop" else None
    if why:
        raise AiosError(
            f"{rec.name} cannot be stopped when idle: {why}",
            "use --autodown (delete when idle) instead of a plain --autostop",
        )
    root = remote_root(rec.name)
    cfg: dict[str, Any] = {
        "cluster": rec.name,
        "zone": rec.zone,
        "cloud": rec.cloud,
        "action": action,
        "idle_seconds": float(idle_seconds),
        "poll": float(poll),
        "settings": provider.agent_settings(),
    }
    head = record_hosts(rec)[0]
    runner = runner_for(rec, printer)
    site = f'PYTHONPATH="{root}/code/.aios-site${{PYTHONPATH:+:$PYTHONPATH}}"'
    agent = f"{shell_word(python)} -m aios_cloud.agent {root}/agent.json >> {root}/agent.log 2>&1"
    # back after a reboot of the head host: cron runs @reboot entries when it starts
    # (crontab(5)); the entry is tagged with the cluster, replaced on every install
    tag = f"# aios-agent {rec.name} (autostop)"
    boot = f"@reboot cd {root} && {site} {agent} < /dev/null & echo $! > {root}/agent.pid {tag}"
    cmd = (
        f"set -e; mkdir -p {root}; umask 077; cat > {root}/agent.json; "
        f'if [ -f {root}/agent.pid ]; then kill "$(cat {root}/agent.pid)" 2>/dev/null || true; fi; '
        f"cd {root}; {site} setsid nohup {agent} "
        f"< /dev/null & echo $! > {root}/agent.pid; echo started; "
        "if command -v crontab >/dev/null 2>&1; then "
        f"{{ crontab -l 2>/dev/null | grep -vF {shlex.quote(tag)} || true; echo {shlex.quote(boot)}; }} "
        "| crontab - && echo reboot:cron; else echo reboot:none; fi"
    )
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg, f)
        tmp = f.name
    try:
        r = runner.run_one(head, cmd, stdin_path=tmp, stream=False)
    finally:
        os.unlink(tmp)
    runner.check([r], "autostop agent")
    what = "delete" if action == "down" else "stop"
    log(
        f"autostop: the agent on {head.label} will {what} {rec.name} after "
        f"{idle_seconds / 60:g} min without a running job"
    )
    if "reboot:cron" not in "\n".join(r.stdout):
        log(
            f"note: the autostop agent will not come back if {head.label} reboots (no crontab "
            "there); aios reinstalls it at its next start or recovery"
        )


def remove_agent(rec: ClusterRecord, printer: Callable[[str, str], None] | None) -> None:
    root = remote_root(rec.name)
    runner = runner_for(rec, printer)
    head = record_hosts(rec)[0]
    tag = shlex.quote(f"# aios-agent {rec.name} (autostop)")
    r = runner.run_one(
        head,
        f'rm -f {root}/agent.json; if [ -f {root}/agent.pid ]; then kill "$(cat '
        f'{root}/agent.pid)" 2>/dev/null || true; fi; '
        f"if crontab -l 2>/dev/null | grep -qF {tag}; then "
        f"crontab -l | grep -vF {tag} | crontab -; fi",
        stream=False,
    )
    runner.check([r], "autostop cancel")


def inventory(provider: CloudProvider) -> list[ClusterInfo]:
    """Every cluster aios created in the cloud (found by the ``aios-cluster`` label / the
    ``aios:cluster`` tag), whether or not this machine has a record of it."""
    return provider.list(None)


def runner_for_name_reset(name: str) -> None:
    """Forget the pinned host keys of a deleted cluster."""
    SshRunner([], cluster_dir(name) / "known_hosts").reset_host_keys()


def refresh(store: Store, provider: CloudProvider, rec: ClusterRecord) -> ClusterRecord:
    info = provider.describe(rec.name, rec.zone)
    if info is None:
        store.update_cluster(rec.name, state="NOT_FOUND")
    else:
        state = (
            info.state
            if not info.unhealthy
            else f"{info.state}/{info.health_detail or 'UNHEALTHY'}"
        )
        store.update_cluster(rec.name, state=state)
        if info.hosts:
            rec = save_hosts(store, rec, info, provider)
            store.update_cluster(rec.name, state=state)
    return store.get_cluster(rec.name) or rec


# ------------------------------------------------------------------------------ launcher guards

_SIGNALLED: list[int] = []


def install_signal_handlers() -> None:
    """SIGTERM (and SIGINT) end every ssh this process runs at once, then unwind the main
    thread (SIGTERM as ``SystemExit(143)``, SIGINT as ``KeyboardInterrupt``), so the launcher's
    cleanup runs within seconds whatever a remote host does."""
    import signal

    from aios_cloud.ssh import kill_all

    def on_term(signum: int, _frame: Any) -> None:
        _SIGNALLED.append(signum)
        kill_all()
        raise SystemExit(128 + signum)

    def on_int(signum: int, _frame: Any) -> None:
        _SIGNALLED.append(signum)
        kill_all()
        raise KeyboardInterrupt

    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, on_term)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, on_int)


def terminated() -> bool:
    """Whether this process got SIGTERM."""
    import signal

    return signal.SIGTERM in _SIGNALLED


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Cleanup (deleting what the launch created) is not cut short by a second Ctrl-C or
    SIGTERM; the signals are ignored while it runs (SIGKILL still ends the process)."""
    import signal

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in saved:
        signal.signal(sig, signal.SIG_IGN)
    try:
        yield
    finally:
        for sig, h in saved.items():
            signal.signal(sig, h)


MIN_OPEN_FILES = 128


def check_open_files(log: Log) -> None:
    """Raise the open-file limit to the hard limit when it is low (macOS defaults to 256);
    refuse to launch, with the fix, when it stays under :data:`MIN_OPEN_FILES`."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    inf = resource.RLIM_INFINITY
    if soft == inf or soft >= 4096:
        return
    target = min(hard, 65536) if hard != inf else 65536
    for want in (target, 10240, 4096):
        if want <= soft:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            continue
        log(f"raised the open-file limit from {soft} to {want}")
        return
    if soft < MIN_OPEN_FILES:
        raise AiosError(
            f"the open-file limit is {soft} (hard limit {hard}); a launch needs {MIN_OPEN_FILES}",
            f"raise it with `ulimit -n {MIN_OPEN_FILES * 8}` and launch again",
        )


def after_watch_failure(
    store: Store,
    provider: CloudProvider,
    job_id: int,
    created: bool,
    exc: BaseException,
    log: Log,
    spawn_watcher: Callable[[], int],
) -> None:
    """The launcher stopped watching a running job (SIGTERM, or the watch itself failed):
    nothing may work unwatched. SIGTERM: the job is stopped on every host and a cluster this
    launch created is deleted. A failed watch: a managed job is handed to a background
    watcher; an unmanaged one is stopped on every host. The user is told which."""
    job = store.get_job(job_id)
    if job is None or job.state in JOB_FINAL:
        return
    rec = store.get_cluster(job.cluster)
    if rec is None:
        return
    with signals_deferred():
        if terminated():
            cancel_job(rec, job_id)
            store.update_job(job_id, state=JOB_CANCELLED, watcher_pid=None)
            store.event(rec.name, "job-cancelled", f"job {job_id}: launcher terminated", job_id)
            if created:
                down_cluster(store, provider, rec)
                log(
                    f"terminated: stopped job {job_id} and deleted {rec.name} (this launch created it)"
                )
            else:
                log(f"terminated: stopped job {job_id} on every host of {rec.name}")
            return
        why = f"{type(exc).__name__}: {str(exc)[:200]}"
        if job.managed:
            pid = spawn_watcher()
            store.update_job(job_id, watcher_pid=pid)
            log(
                f"the watch failed ({why}); a background watcher (pid {pid}) takes over job {job_id}'s managed recovery"
            )
            return
        cancel_job(rec, job_id)
        store.update_job(job_id, state=JOB_FAILED, watcher_pid=None)
        store.event(rec.name, "job-failed", f"job {job_id}: watch failed: {why}", job_id)
        log(
            f"the watch failed ({why}); stopped job {job_id} on every host so nothing runs unwatched"
        )


def dry_run_lines(commands: list[CloudCommand]) -> list[str]:
    return [c.shell() for c in commands]


__all__ = [
    "JobSpec",
    "LogFollower",
    "Watcher",
    "WatchOptions",
    "cancel_job",
    "down_cluster",
    "get_provider",
    "host_commands",
    "parse_env",
    "poll_job",
    "provision",
    "record_hosts",
    "refresh",
    "require_cluster",
    "run_setup",
    "runner_for",
    "reinstall_agent",
    "remember_autostop",
    "start_cluster",
    "start_job",
    "stop_cluster",
    "sync_code",
    "PREEMPTED",
]
