"""``aios launch --cloud slurm`` and ``aios logs`` for Slurm jobs (see :mod:`aios_cloud_slurm.provider`)."""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from aios.config.redact import redact
from aios.errors import AiosError
from aios_cloud.bundle import build
from aios_cloud.codesync import collect, data_line, make_tarball
from aios_cloud.jobs import env_file
from aios_cloud.provider.data import ClusterInfo
from aios_cloud.provider.errors import CloudError
from aios_cloud.request import LaunchRequest
from aios_cloud.store import (
    JOB_CANCELLED,
    JOB_FAILED,
    JOB_PENDING,
    JOB_RECOVERING,
    JOB_RUNNING,
    JOB_SUCCEEDED,
    ClusterRecord,
    Store,
    cluster_dir,
)

from aios_cloud_slurm.states import FINAL_STATES, NAME_RE, default_name, gres_gpus

if TYPE_CHECKING:
    from aios_cloud_slurm.settings import SlurmSettings
    from aios_cloud_slurm.shell import Shell
from aios_cloud_slurm.script import SbatchJob, render


class SlurmAccess(Protocol):
    """What the launch needs of the Slurm provider (:class:`aios_cloud_slurm.provider.SlurmProvider`
    passes itself; declared here so this module does not import the provider)."""

    name: ClassVar[str]
    settings: SlurmSettings
    shell: Shell

    def require_slurm(self) -> None: ...
    def partitions(self) -> list[dict[str, Any]]: ...
    def cluster_config(self) -> dict[str, str]: ...
    def resolve_partition(self, wanted: str | None) -> dict[str, Any]: ...
    def job_info(self, job_id: str) -> dict[str, str] | None: ...
    def final_exit(self, request: dict[str, Any]) -> int | None: ...
    def describe(self, name: str, zone: str | None) -> ClusterInfo | None: ...
    def cancel(self, name: str) -> None: ...


def _check(p: LaunchRequest) -> None:
    # the options Slurm does not support were refused against SlurmProvider.features
    if p.name and not NAME_RE.match(p.name):
        raise AiosError(
            f"cluster name '{p.name}' is invalid",
            "use 1-48 lowercase letters, digits and dashes, starting with a letter",
        )


def resources(
    s: SlurmSettings,
    backend: str,
    part: dict[str, Any] | None,
    conf: dict[str, str] | None,
) -> tuple[dict[str, Any], list[str]]:
    """The job's GPU and CPU request (:class:`SbatchJob` fields) and what the user should know.

    "Jobs will not be allocated any generic resources unless specifically requested at job
    submit time" (https://slurm.schedmd.com/gres.html): a cuda job asks for every GPU of a node
    of the partition (``slurm.gpus_per_node`` chooses), with ``--gpus-per-node`` where the
    cluster schedules trackable resources (``SelectType=select/cons_tres``), else with
    ``--gres=gpu:N``. Its tasks get the node's CPUs in the share of its GPUs the job asks for (a
    CPU job all of them), unless ``slurm.cpus_per_task`` or ``slurm.exclusive`` says otherwise.
    ``part`` and ``conf`` are None when the cluster was not asked (a dry run without Slurm)."""
    notes: list[str] = []
    node_gpus = gres_gpus(part["gres"]) if part else 0
    gpus: int | None = None
    if s.gpus_per_task is None:
        if s.gpus_per_node is not None:
            gpus = s.gpus_per_node or None
        elif backend == "cuda":
            if node_gpus:
                gpus = node_gpus
            elif part is not None:
                notes.append(
                    f"partition {part['name']} declares no GPUs (sinfo %G: {part['gres']}): the "
                    "job asks Slurm for none; set slurm.gpus_per_node if its nodes have GPUs"
                )
            else:
                notes.append(
                    "GPUs per node unknown (no Slurm was asked): the script asks for none; set "
                    "slurm.gpus_per_node"
                )
    select = (conf or {}).get("SelectType", "select/cons_tres")
    flag = "gpus-per-node" if "cons_tres" in select else "gres"
    cpus = s.cpus_per_task
    if cpus is None and not s.exclusive:
        node_cpus = (part or {}).get("cpus_min") or 0
        if node_cpus:
            asked = gpus if gpus else (s.gpus_per_task or 0) * s.ntasks_per_node
            if asked and node_gpus:
                node_cpus = node_cpus * min(asked, node_gpus) // node_gpus
            cpus = max(1, node_cpus // s.ntasks_per_node)
        else:
            notes.append(
                "CPUs per node unknown (no Slurm was asked): the script asks for no "
                "--cpus-per-task; set slurm.cpus_per_task"
            )
    fields = {
        "gpus_per_task": s.gpus_per_task,
        "gpus_per_node": gpus,
        "gpu_flag": flag,
        "cpus_per_task": cpus,
        "exclusive": s.exclusive,
    }
    return fields, notes


def build_job(
    provider: SlurmAccess,
    p: LaunchRequest,
    name: str,
    part: dict[str, Any] | None,
    conf: dict[str, str] | None,
    root: str,
    job_id: int | str,
    env: dict[str, str],
    forward: list[str],
) -> SbatchJob:
    s = provider.settings
    args = list(p.script_args)
    if args and args[0] == "--":
        args = args[1:]
    partition = part["name"] if part else p.zone or p.accelerator or s.partition
    backend = p.backend or ("cuda" if part and gres_gpus(part["gres"]) else "cpu")
    res, notes = resources(s, backend, part, conf)
    if part is None and not p.backend:
        notes.insert(
            0,
            "the partition's GPUs are unknown (no Slurm was asked): the script runs the cpu "
            "backend; pass --backend cuda (and set slurm.gpus_per_node) for GPUs",
        )
    python = p.python or s.python
    command = [python, "-m", "aios.cli.run", "--backend", backend]
    command += ["-m", p.script] if p.module else [p.script]
    command += args
    setup = list(s.setup)
    if p.setup_script:
        setup.append(Path(p.setup_script).read_text())
    elif p.requirements and not p.no_setup:
        if not Path(p.requirements).is_file():
            raise AiosError(
                f"--requirements {p.requirements} does not exist",
                "pass an existing requirements.txt",
            )
        setup.append(
            f"{shlex.quote(python)} -m pip install --quiet --user -r {shlex.quote(os.path.basename(p.requirements))}"
        )
    job_env = dict(env)
    ckpt = p.checkpoint_dir
    if p.max_restarts > 0 and not ckpt:
        ckpt = f"{root}/checkpoints"
    if ckpt:
        job_env["AIOS_CHECKPOINT__DIR"] = ckpt
    job_dir = f"{root}/jobs/{job_id}"
    return SbatchJob(
        name=name,
        job_dir=job_dir,
        code_dir=f"{root}/code",
        command=command,
        nodes=p.nodes,
        ntasks_per_node=s.ntasks_per_node,
        partition=partition,
        account=s.account,
        qos=s.qos,
        time=s.time,
        **res,
        mem=s.mem,
        constraint=s.constraint,
        max_restarts=p.max_restarts,
        signal_grace=s.signal_grace,
        env=job_env,
        env_file=f"{job_dir}/env" if forward else None,
        pythonpath=f"{root}/code/.aios-site" if not p.no_bundle else None,
        setup=setup,
        sbatch_args=list(s.sbatch_args),
        notes=notes,
    )


def _remote_root(provider: SlurmAccess, name: str) -> str:
    rd = provider.settings.remote_dir
    text = provider.shell.out(
        f"mkdir -p {rd} && cd {rd} && pwd", "creating slurm.remote_dir"
    ).strip()
    return f"{text.splitlines()[-1]}/{name}"


def dry_run(
    provider: SlurmAccess,
    p: LaunchRequest,
    name: str,
    wanted: str | None,
    echo: Callable[[str], None],
) -> None:
    """``--dry-run``: the sync, the env file and the sbatch script the launch would submit."""
    env, forward = p.env, p.forward_env
    part: dict[str, Any] | None = None
    conf: dict[str, str] | None = None
    try:
        provider.require_slurm()
        provider.partitions()  # the cluster answers
    except CloudError as exc:  # no Slurm reachable from here: the script, unchecked, and why
        echo(f"# note: {exc.one_line()} (the script below is not checked against the cluster)")
    else:  # a partition the cluster does not have is an error, as in the launch
        part = provider.resolve_partition(wanted)
        conf = provider.cluster_config()
    rd = provider.settings.remote_dir
    root = f"{rd}/{name}"
    job = build_job(provider, p, name, part, conf, root, "<id>", env, forward)
    for note in job.notes:
        echo(f"# note: {note}")

    job.env = redact(job.env)
    echo("# dry run: nothing is synced or submitted")
    where = provider.shell.where
    echo(
        f"# 1. code sync {where}: {len(collect(p.workdir, p.exclude))} files from "
        f"{os.path.abspath(p.workdir)} -> {root}/code"
    )
    left = data_line(p.workdir, p.exclude)
    if left:
        echo(f"# {left}")
    if forward:
        echo(
            f"# 2. {job.env_file} (mode 600): {', '.join(forward)} <forwarded from your environment>"
        )
    echo(f"# 3. sbatch --parsable {job.job_dir}/job.sbatch {where}:")
    echo(render(job))


def _claim(provider: SlurmAccess, store: Any, name: str, part: dict[str, Any]) -> Any:
    """The store's record for ``name`` (a finished job's name is reused), or claim it; returns
    the record that existed, ``None`` when this launch claimed it."""

    existing = store.get_cluster(name)
    if existing is not None:
        if existing.cloud != provider.name:
            raise AiosError(f"cluster {name} exists on {existing.cloud}", "use another --name")
        info = provider.describe(name, existing.zone)
        if info is not None and info.state not in FINAL_STATES | {"GONE"}:
            raise AiosError(
                f"{name} already has Slurm job {info.raw.get('slurm_job_id')} ({info.state})",
                f"`aios cancel {name}` first, or use another --name",
            )
    else:
        if not store.claim_cluster(
            ClusterRecord(
                name,
                provider.name,
                part["name"],
                part["name"],
                False,
                "SUBMITTING",
                request={"login": provider.shell.login},
            )
        ):
            raise AiosError(
                f"cluster {name} was just created by another launch", "use another --name"
            )
    return existing


def launch(provider: SlurmAccess, p: LaunchRequest, store: Any, log: Callable[[str], None]) -> int:
    import click

    _check(p)
    env, forward = p.env, p.forward_env
    name = p.name or default_name()
    wanted = p.zone or p.accelerator or provider.settings.partition
    if p.dry_run:
        dry_run(provider, p, name, wanted, click.echo)
        return 0

    provider.require_slurm()
    part = provider.resolve_partition(wanted)
    if part["nodes"] and p.nodes > part["nodes"]:
        raise AiosError(
            f"--nodes {p.nodes} is more than partition {part['name']} has ({part['nodes']})",
            f"pass --nodes {part['nodes']} or fewer, or another partition (`aios catalog --cloud slurm`)",
        )
    existing = _claim(provider, store, name, part)
    job_id = store.add_job(
        name,
        shlex.join([p.script, *p.script_args]),
        backend=p.backend,
        managed=p.max_restarts > 0,
        max_restarts=p.max_restarts,
        checkpoint_dir=p.checkpoint_dir,
        spec={"cloud": "slurm"},
    )
    submitted = False
    slurm_id = ""
    try:
        root = _remote_root(provider, name)
        job = build_job(
            provider, p, name, part, provider.cluster_config(), root, job_id, env, forward
        )
        for note in job.notes:
            log(f"note: {note}")
        _sync(provider, p, root, log)
        _write(provider, f"{job.job_dir}/job.sbatch", render(job), mode="755")
        if forward:
            values = {k: os.environ[k] for k in forward if k in os.environ}
            missing = [k for k in forward if k not in os.environ]
            if missing:
                raise AiosError(
                    f"--env {missing[0]} is not set in your environment",
                    f"export {missing[0]} before aios launch",
                )
            _write(provider, job.env_file or "", env_file(values), mode="600")
        r = provider.shell.run(
            f"cd {shlex.quote(job.job_dir)} && sbatch --parsable job.sbatch", timeout=120
        )
        if r.returncode != 0:
            msg = (r.stderr or r.stdout).decode(errors="replace").strip().splitlines()
            line = msg[-1] if msg else f"exit {r.returncode}"
            raise CloudError(
                f"sbatch rejected the job: {line.removeprefix('sbatch: error: ')}",
                "fix the partition/account/time/resources (slurm.* settings; see `sinfo`, "
                "`sacctmgr show assoc user=$USER`)",
            )
        slurm_id = r.stdout.decode().strip().split(";")[0]
        submitted = True
        _check_runnable(provider, slurm_id)
        store.update_cluster(
            name,
            state="PENDING",
            request={
                "login": provider.shell.login,
                "slurm_job_id": slurm_id,
                "job_dir": job.job_dir,
                "root": root,
                "job_id": job_id,
            },
        )
        store.update_job(
            job_id,
            state=JOB_PENDING,
            spec={
                "cloud": "slurm",
                "slurm_job_id": slurm_id,
                "job_dir": job.job_dir,
                "script": p.script,
                "python": p.python or provider.settings.python,
            },
        )
        store.event(
            name,
            "submitted",
            f"Slurm job {slurm_id} on partition {part['name']}, {p.nodes} node(s)",
            job_id,
        )
        log(
            f"submitted Slurm job {slurm_id} ({name}, partition {part['name']}, {p.nodes} "
            f"node(s)); output {job.job_dir}/slurm-{slurm_id}.out"
        )
    except BaseException as exc:
        store.update_job(job_id, state=JOB_CANCELLED if submitted else JOB_FAILED)
        store.event(name, "job-failed", f"job {job_id}: launch failed: {str(exc)[:200]}", job_id)
        if submitted:
            provider.shell.run(f"scancel {shlex.quote(slurm_id)}", timeout=60)
        if existing is None:
            store.delete_cluster(name)
        raise
    if p.detach:
        log(f"`aios logs {name} -f`, `aios status {name} --refresh`, `aios cancel {name}`")
        return 0
    try:
        code = follow(provider, store, name, job_id, slurm_id, job.job_dir, p.poll, click.echo, log)
    except KeyboardInterrupt:
        log(
            f"detached: Slurm job {slurm_id} keeps running. `aios logs {name} -f`, `aios cancel {name}`"
        )
        return 130
    if p.down_after:
        provider.cancel(name)
        store.delete_cluster(name)
    return code


# pending reasons that never resolve on their own: the request does not fit the partition/account
NEVER_RUNS = (
    "PartitionConfig",
    "PartitionNodeLimit",
    "PartitionTimeLimit",
    "AccountNotAllowed",
    "QOSNotAllowed",
    "InvalidAccount",
    "InvalidQOS",
    "BadConstraints",
    "ReqNodeNotAvail",
    "PartitionDown",
    "PartitionInactive",
)


def _check_runnable(provider: SlurmAccess, slurm_id: str) -> None:
    """A job sbatch accepted but that can never start is cancelled and reported (one line)."""
    time.sleep(1.0)
    info = provider.job_info(slurm_id) or {}
    reason = info.get("Reason", "")
    if info.get("JobState") == "PENDING" and any(reason.startswith(r) for r in NEVER_RUNS):
        raise CloudError(
            f"Slurm will never start the job (pending: {reason}); it was cancelled",
            "fix the partition/nodes/time/account request (see `sinfo` and `scontrol show partition`)",
        )


def _sync(provider: SlurmAccess, p: LaunchRequest, root: str, log: Callable[[str], None]) -> None:
    extra: list = []
    generated: dict[str, str] = {}
    if not p.no_bundle:
        b = build(p.backend or "cpu", provider.name)
        extra, generated = b.files, b.generated
    name = root.rsplit("/", 1)[-1]
    tar = make_tarball(
        p.workdir,
        cluster_dir(name) / "code.tar.gz",
        p.exclude,
        p.max_sync_mb * 2**20,
        extra_files=extra,
        generated=generated,
    )
    left = data_line(p.workdir, p.exclude)
    if left:
        log(left)
    log(
        f"syncing {tar.files} files ({tar.bytes / 1024:.0f} KiB) to {root}/code {provider.shell.where}"
    )
    q = shlex.quote(root)
    cmd = (
        f"set -e; mkdir -p {q}; rm -rf {q}/code.new; mkdir {q}/code.new; tar xzf - -C {q}/code.new; "
        f"rm -rf {q}/code; mv {q}/code.new {q}/code"
    )
    r = provider.shell.run(cmd, stdin_path=str(tar.path), timeout=600)
    if r.returncode != 0:
        raise CloudError(
            f"code sync failed {provider.shell.where}: {r.stderr.decode(errors='replace').strip()[-200:]}",
            "check slurm.remote_dir is writable and on a shared filesystem",
        )


def _write(provider: SlurmAccess, path: str, text: str, mode: str) -> None:
    q = shlex.quote(path)
    r = provider.shell.run(
        f"set -e; mkdir -p $(dirname {q}); umask 077; cat > {q}.tmp; chmod {mode} {q}.tmp; mv {q}.tmp {q}",
        input=text.encode(),
    )
    if r.returncode != 0:
        raise CloudError(
            f"cannot write {path} {provider.shell.where}: {r.stderr.decode(errors='replace').strip()[-200:]}",
            "check slurm.remote_dir",
        )


def _read_from(provider: SlurmAccess, path: str, offset: int) -> bytes:
    r = provider.shell.run(
        f"tail -c +{offset + 1} {shlex.quote(path)} 2>/dev/null || true", timeout=60
    )
    return r.stdout


def follow(
    provider: SlurmAccess,
    store: Any,
    name: str,
    job_id: int,
    slurm_id: str,
    job_dir: str,
    poll: float,
    echo: Callable[[str], None],
    log: Callable[[str], None],
) -> int:
    """Print the job's output as it grows, record its state and restarts; the job's exit status."""

    out_path = f"{job_dir}/slurm-{slurm_id}.out"
    offset = 0
    restarts = 0
    last_state = ""
    partial = b""
    gone_since: float | None = None
    while True:
        info = provider.job_info(slurm_id)
        chunk = _read_from(provider, out_path, offset)
        offset += len(chunk)
        data = partial + chunk
        *lines, partial = data.split(b"\n")
        for line in lines:
            echo(line.decode(errors="replace"))
        state = info.get("JobState", "UNKNOWN") if info else "GONE"
        if info:
            n = int(info.get("Restarts", "0") or 0)
            if n > restarts:
                restarts = n
                store.update_job(job_id, restarts=n)
                store.event(
                    name,
                    "preempted",
                    f"Slurm job {slurm_id} stopped for a preemption/time limit after an emergency checkpoint",
                    job_id,
                )
                store.event(
                    name,
                    "recovered",
                    f"recovery {n}: requeued by Slurm, resuming from the checkpoint",
                    job_id,
                )
        if state != last_state:
            store.update_cluster(name, state=state)
            if state == "RUNNING":
                store.update_job(job_id, state=JOB_RUNNING)
            elif state in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED") and last_state:
                store.update_job(job_id, state=JOB_RECOVERING)
            last_state = state
        if state in FINAL_STATES or state == "GONE":
            if state == "GONE":
                gone_since = gone_since or time.monotonic()
                if time.monotonic() - gone_since < 3 * poll:
                    time.sleep(poll)
                    continue
            time.sleep(min(poll, 1.0))
            tail = _read_from(provider, out_path, offset)
            for text in (partial + tail).decode(errors="replace").splitlines():
                echo(text)
            code = provider.final_exit({"job_dir": job_dir})
            if state == "CANCELLED":
                store.update_job(job_id, state=JOB_CANCELLED)
                log(f"Slurm job {slurm_id} was cancelled")
                return 130 if code is None else (code or 130)
            if code is None:
                code = 0 if state == "COMPLETED" else 1
            store.update_job(
                job_id, state=JOB_SUCCEEDED if code == 0 else JOB_FAILED, exit_codes=[code]
            )
            if code:
                log(
                    f"Slurm job {slurm_id} ended {state} with exit status {code}; see `aios logs {name}`"
                )
            return code
        time.sleep(poll)


def logs(
    provider: SlurmAccess,
    rec: Any,
    job: Any,
    follow_: bool,
    dry_run: bool,
    echo: Callable[[str], None],
) -> int:
    spec = job.spec or {}
    slurm_id, job_dir = spec.get("slurm_job_id"), spec.get("job_dir")
    if not slurm_id or not job_dir:
        raise AiosError(
            f"job {job.id} of {rec.name} was never submitted to Slurm",
            f"see `aios status {rec.name}`",
        )
    path = f"{job_dir}/slurm-{slurm_id}.out"
    if dry_run:
        echo(
            shlex.join(
                provider.shell.argv(("tail -n +1 -F " if follow_ else "cat ") + shlex.quote(path))
            )
        )
        return 0
    if not follow_:
        r = provider.shell.run(
            f"cat {shlex.quote(path)} 2>/dev/null || echo '[aios] no output yet'", timeout=120
        )
        for line in r.stdout.decode(errors="replace").splitlines():
            echo(line)
        return 0

    try:
        return follow(
            provider,
            Store(),
            rec.name,
            job.id,
            slurm_id,
            job_dir,
            provider.settings.poll_interval,
            echo,
            lambda m: None,
        )
    except KeyboardInterrupt:
        return 0
