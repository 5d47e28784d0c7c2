"""A job on the hosts: code sync, setup, the per-host commands from the backend's launch plan,
start, poll and cancel.

Remote layout on every host (under the login user's ``$HOME``)::

    ~/aios/<cluster>/code/            the synced working directory (jobs run here)
    ~/aios/<cluster>/setup.sha        hash of the setup script that last succeeded
    ~/aios/<cluster>/jobs/<id>/       run.sh, env (mode 600), pid, worker.log, exit_code,
                                      status/ (the runtime's per-rank ``preempted`` markers)

A job whose workers stopped for a preemption notice (the runtime writes ``status/rank<N>``
starting with ``preempted`` after its emergency checkpoint, then exits 75; torchrun reports 1
for the group) records exit code 75 (:data:`aios.resilience.notices.EXIT_PREEMPTED`), and the watcher
treats it as a preemption, not a failure.

Jobs run detached (``setsid nohup``) so a dropped SSH connection never kills them; the watcher
polls ``exit_code``/``pid`` over SSH and the cloud's view of the cluster (preempted, unhealthy).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from aios.config.schema import env_overrides
from aios.errors import AiosError
from aios.launcher import status as rank_status
from aios.launcher.contract import LAUNCH_TIME_ENV, RUN_ID_ENV, STATUS_DIR_ENV
from aios.plugins.registry import get_registry
from aios.resilience.notices import EXIT_PREEMPTED
from aios.types import Host, LaunchRequest

from aios_cloud.bundle import build
from aios_cloud.codesync import data_line, make_manifest, secret_files
from aios_cloud.head import Head, setup_timeout
from aios_cloud.records import Log, record_hosts, remote_root, runner_for
from aios_cloud.request import JobSpec
from aios_cloud.request import parse_env as parse_env
from aios_cloud.ssh import (
    SSH_RETRIES,
    HostKeyChanged,
    SshError,
)
from aios_cloud.store import (
    ClusterRecord,
)


def reach(rec: ClusterRecord, printer: Callable[[str, str], None] | None, log: Log) -> None:
    """Wait until every host of ``rec`` answers (see :meth:`Head.reach`)."""
    Head(rec, printer, log).reach()


def sync_code(
    rec: ClusterRecord, spec: JobSpec, printer: Callable[[str, str], None] | None, log: Log
) -> None:
    """Ship the workdir (and aios itself) to every host: the head host gets only the content
    it does not already have; it copies the code to the other hosts over the cluster network."""

    extra: list = []
    generated: dict[str, str] = {}
    if spec.bundle:
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
    left = data_line(spec.workdir, spec.excludes)
    if left:
        log(left)
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

    hosts = record_hosts(rec)
    ft = env_overrides(spec.env).get("ft")
    if ft:  # the job's `--env AIOS_FT__*` settings: replica groups shape the hosts' commands
        config = config.model_copy(
            update={"ft": type(config.ft).model_validate({**config.ft.model_dump(), **ft})}
        )
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
    plan = reg.launch_plan(spec.backend, config, req)
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
    source: Mapping[str, str] = os.environ if environ is None else environ
    env = dict(provider_env)
    env.update(spec.env)
    if spec.checkpoint_dir:
        env["AIOS_CHECKPOINT__DIR"] = spec.checkpoint_dir
    for name in spec.forward_env:
        if name not in source:
            raise AiosError(
                f"--env {name} asks to forward {name}, which is not set here",
                f"export {name} first",
            )
        env[name] = source[name]
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
            # the ranks' threads from the CPUs this host lets the run use (nproc: its affinity),
            # shared among its ranks; the user's --env OMP_NUM_THREADS wins
            '[ -n "${OMP_NUM_THREADS:-}" ] || export OMP_NUM_THREADS='
            f"$(( $(nproc) / {max(1, plan.nprocs)} > 0 ? $(nproc) / {max(1, plan.nprocs)} : 1 ))",
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
            f'if [ $rc -ne 0 ] && [ -f "$D/status/{rank_status.HUNG}" ]; then echo "[aios] the watchdog '
            "stopped "
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
) -> int:
    """Write run.sh and env on every host and start it detached. Returns the number of
    processes over all hosts."""
    plans = host_commands(rec, spec, config)
    # each start of the job its own run record (torchrun's rendezvous id, the same for every
    # attempt, would otherwise name them all), and the launch time its goodput start-up counts
    # from (aios.runrecord.goodput)
    started = time.time()
    attempt = {
        RUN_ID_ENV: time.strftime("%Y%m%d-%H%M%S", time.gmtime(started))
        + f"-job{job_id}-{os.urandom(2).hex()}",
        LAUNCH_TIME_ENV: repr(started),
    }
    base_env = {**attempt, **job_env(spec, provider_env)}
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
    return sum(p.nprocs for p in plans.values())


def poll_job(
    rec: ClusterRecord, job_id: int, retries: int = SSH_RETRIES
) -> list[tuple[str, int | None]]:
    """Per host (worker order): ``("EXIT", code)``, ``("RUNNING", None)``, ``("LOST", None)``
    (no process and no exit code: the host rebooted or was replaced), ``("REPLACED", None)``
    (a different machine answers at the host's address: its host key changed) or
    ``("UNREACHABLE", None)``. Never raises for one host's SSH trouble. ``retries``: extra SSH
    attempts to the head host (with back-off) before its hosts count as unreachable."""
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
        results, outputs = Head(rec, retries=retries).fan("polled", cmd=cmd, timeout=60, echo=False)
    except HostKeyChanged:
        lost: list[tuple[str, int | None]] = [("UNREACHABLE", None)] * (len(hosts) - 1)
        return [("REPLACED", None), *lost]
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
        # the whole group must be gone, not only run.sh (which SIGTERM ends at once): ranks that
        # handle SIGTERM checkpoint first, and one still running after the grace is killed
        f"for i in $(seq {int(grace * 10)}); do kill -0 -- -$p 2>/dev/null || exit 0; sleep 0.1; "
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
