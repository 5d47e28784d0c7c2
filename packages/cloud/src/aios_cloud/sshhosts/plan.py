"""Planning a cluster on the user's hosts: reach and inspect every host, check them against
the request, number the workers, check a shared checkpoint directory; and the cleanup."""

from __future__ import annotations

import os
import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aios_cloud.provider.base import Echo
from aios_cloud.provider.data import ClusterHost, ClusterRequest
from aios_cloud.provider.errors import CloudError
from aios_cloud.ssh import HostKeyChanged, HostResult, SshError, SshRunner
from aios_cloud.sshhosts.hosts import (
    ACCELERATORS,
    DEFAULT_HOST_WAIT,
    SshHost,
    cluster_hosts,
    cluster_record,
    host_specs,
)
from aios_cloud.sshhosts.probe import Probe, internal_addresses, probe_command, resolve_address
from aios_cloud.sshhosts.shell import cleanup_command, dry_ssh, first_line, probe_python, ssh_dest
from aios_cloud.store import cluster_dir


def host_runner(name: str, hosts: list[ClusterHost], key: str | None, **kw: Any) -> Any:
    return SshRunner(hosts, cluster_dir(name) / "known_hosts", key=key, alias=f"aios-{name}", **kw)


def reach(
    name: str, hosts: list[ClusterHost], key: str | None, wait: float, python: str
) -> tuple[dict[int, Probe], dict[int, str]]:
    """Probe every host until it answers or ``wait`` seconds passed. Returns the probes of the
    hosts that answered and why each other host did not. A changed host key or a refused
    login ends at once (waiting does not fix them)."""
    runner = host_runner(name, hosts, key, retries=0, connect_timeout=10)
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
                    f"the host key of {h.label} ({ssh_dest(h)}) changed since aios "
                    "first connected; aios does not trust it by itself",
                    f"if that machine was reinstalled, `aios down {name}` and launch again "
                    "(the key is pinned anew); otherwise find out why",
                )
            if isinstance(r, SshError):
                raise CloudError(
                    f"{h.label}: {r.message if hasattr(r, 'message') else r}",
                    f"check that `{shlex.join(dry_ssh(h, None, 'true')[:-3] + [ssh_dest(h)])}` logs in without a "
                    "password (pass --identity KEY if it needs a key)",
                )
            if r.returncode == 0:
                probes[h.worker_id] = Probe.parse(r.stdout)
                down.pop(h.worker_id, None)
            else:
                down[h.worker_id] = (
                    first_line(r.stderr)
                    or first_line(r.stdout)
                    or f"ssh exit status {r.returncode}"
                )
                pending.append(h)
        if pending and time.monotonic() + delay <= deadline:
            time.sleep(delay)
            delay = min(delay * 2, 10.0)
        else:
            break
    return probes, down


def plan_hosts(
    request: ClusterRequest, recovering: bool, python_cmd: str
) -> tuple[list[SshHost], list[str]]:
    """Reach, inspect and check the hosts; the cluster's hosts and the notes to print."""
    name = request.name
    extra = request.extra
    specs = host_specs(request)
    key = extra.get("identity")
    # the probe reads versions only: the user's --python, else the host's python3 (aios's own
    # environment may not exist yet)
    python = probe_python(extra.get("python") or python_cmd)
    wait = float(extra.get("host_wait", DEFAULT_HOST_WAIT))
    wait = wait if recovering else min(30.0, wait)
    hosts = cluster_hosts(specs, key)
    probes, down = reach(name, hosts, key, wait, python)
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
    ssh_addrs = [resolve_address(h.ip) for h in up]
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
        check_shared(name, [h for h in hosts if h.worker_id in probes], key, shared)
    return out, notes


def check_shared(name: str, hosts: list[ClusterHost], key: str | None, path: str) -> None:
    """A managed run's local checkpoint directory must be one filesystem for every host."""
    marker = f"{path.rstrip('/')}/.aios-shared-{os.getpid()}-{int(time.time() * 1000)}"
    runner = host_runner(name, hosts, key, retries=1)
    q, d = shlex.quote(marker), shlex.quote(path)
    head = runner.run_one(hosts[0], f"mkdir -p {d} && echo {name} > {q}", stream=False)
    if not head.ok:
        raise CloudError(
            f"--checkpoint-dir {path}: {hosts[0].label} cannot write there ({first_line(head.stderr)})",
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


def clean(name: str, remove: bool, log: Echo) -> None:
    """End aios's processes of cluster ``name`` on every listed host that answers; with
    ``remove`` also delete aios's own files there (see the module docstring)."""
    rec = cluster_record(name)
    if rec is None or not rec.hosts:
        # never reached (a create that failed at the probe): nothing of it is on the hosts,
        # and what is there under this name belongs to someone else
        return
    specs = host_specs(rec.request)
    key = (rec.request.get("extra") or {}).get("identity")
    hosts = cluster_hosts(specs, key)
    if not hosts:
        return
    runner = host_runner(name, hosts, key, retries=1, connect_timeout=8)
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
            log(
                f"{r.host.label} did not answer ({first_line(r.stderr) or r.returncode}); aios's "
                f"processes and files of {name} there (~/aios/{name}) were left as they are"
            )
        for line in r.stdout:
            if line.startswith("kept "):
                log(f"{r.host.label}: {line}")
