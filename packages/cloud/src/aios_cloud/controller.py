"""Managed jobs whose controller survives the laptop: ``aios launch --max-restarts N
--controller USER@HOST[:PORT]``.

The recovery loop (:class:`aios_cloud.Watcher`, the same one a foreground launch runs) is
started detached (``setsid nohup python -m aios_cloud.watch``) on a small controller host that
stays up when the launching machine sleeps or is gone. The controller gets, under
``~/aios-controller/<cluster>/``:

* ``home/``: its own aios home: a state database holding the cluster and the job, the aios SSH
  key (mode 600) that reaches the cluster, the pinned host keys;
* ``work/``: the code that is re-synced to recreated hosts (the same files code sync ships);
* ``site/``: this aios and its plugins (the same bundle the hosts get);
* ``config.json``: the cloud's config section as the controller must use it (no credentials:
  on a cloud VM the controller uses its service account / instance profile);
* ``controller.env`` (mode 600): values of ``--env NAME`` forwarded from here, which a restart
  must pass again;
* ``controller.log``, ``controller.pid``.

Locally the job records a ``controller`` event (host, directory, remote job id, pid);
``aios status`` shows it, and ``aios status --refresh`` reads the job's state, restarts and
recoveries from the controller's own database.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aios.errors import AiosError

from aios_cloud.bundle import SITE, build
from aios_cloud.codesync import make_tarball
from aios_cloud.provider.base import CloudProvider
from aios_cloud.provider.data import ClusterHost
from aios_cloud.provider.errors import CloudError
from aios_cloud.request import split_target
from aios_cloud.shapes import SHAPE, SHAPE_END
from aios_cloud.ssh import SshRunner
from aios_cloud.store import JOB_RUNNING, ClusterRecord, JobRecord, Store, cluster_dir

Log = Callable[[str], None]


def parse_target(target: str, default_user: str) -> ClusterHost:
    user, host, port = split_target(target)
    return ClusterHost(0, host, host, ssh_user=user or default_user, port=port)


def _runner(rec_name: str, host: ClusterHost, key: str | None) -> SshRunner:
    host.ssh_key = key
    return SshRunner(
        [host],
        cluster_dir(rec_name) / "controller_known_hosts",
        key=key,
        alias=f"aios-ctl-{rec_name}",
    )


def start_controller(
    store: Store,
    provider: CloudProvider,
    rec: ClusterRecord,
    job_id: int,
    spec: Any,
    target: str,
    key: str | None,
    python: str,
    poll: float,
    down_after: bool,
    log: Log,
) -> dict[str, Any]:
    """Ship the job to the controller host and start its recovery loop there. Returns the
    controller record (also stored as the job's ``controller`` event)."""
    host = parse_target(target, rec.ssh_user or "aios")
    runner = _runner(rec.name, host, key)
    r = runner.run_one(host, 'echo "$HOME"', stream=False, timeout=60)
    runner.check([r], "controller")
    home = (r.stdout[-1] if r.stdout else "").strip()
    if not home.startswith("/"):
        raise AiosError(
            f"controller {target} did not say where its home is",
            "check the controller host accepts SSH with the aios key",
        )
    ctl = f"{home}/aios-controller/{rec.name}"
    job = store.get_job(job_id)
    assert job is not None
    if key is None:
        raise CloudError(
            "--controller needs an SSH key aios can give the controller host to reach the cluster",
            "pass --ssh-key (--identity) with the key your hosts accept",
        )
    with tempfile.TemporaryDirectory(prefix="aios-ctl-") as tmp:
        stage = Path(tmp) / "ctl"
        _stage_keys(stage, rec.name, key)
        _stage_code(stage, Path(tmp), spec, rec.cloud)
        (stage / "config.json").write_text(
            json.dumps({rec.cloud: provider.agent_settings() | provider.controller_settings()})
        )
        _stage_env(stage, spec)
        rid = _stage_store(stage, store, rec, job, spec, ctl)
        bundle = Path(tmp) / "ctl.tar.gz"
        with tarfile.open(bundle, "w:gz") as t:
            t.add(stage, arcname=".")
        r = runner.run_one(
            host,
            f"set -e; rm -rf {ctl}; mkdir -p {ctl}; chmod 700 {ctl}; tar xzf - -C {ctl}",
            stdin_path=str(bundle),
            stream=False,
            timeout=600,
        )
        runner.check([r], "controller setup")
    argv = [
        python,
        "-m",
        "aios_cloud.watch",
        str(rid),
        "--cloud",
        rec.cloud,
        "--poll",
        str(poll),
        "--config",
        f"{ctl}/config.json",
    ]
    if down_after:
        argv.append("--down")
    start = (
        f"cd {ctl} || exit 1; set -a; . ./controller.env; set +a; export AIOS_HOME={ctl}/home "
        f'PYTHONPATH="{ctl}/site${{PYTHONPATH:+:$PYTHONPATH}}"; setsid nohup '
        f"{shlex.join(argv)} > {ctl}/controller.log 2>&1 "
        f"< /dev/null & echo $! > {ctl}/controller.pid; cat {ctl}/controller.pid"
    )
    r = runner.run_one(host, start, stream=False, timeout=60)
    runner.check([r], "controller start")
    pid = int((r.stdout[-1] if r.stdout else "0").strip() or 0)
    info = {"target": target, "dir": ctl, "job": rid, "pid": pid, "python": python}
    store.event(rec.name, "controller", json.dumps(info), job_id)
    store.update_job(job_id, watcher_pid=None)
    log(
        f"managed job {job_id} is watched by a controller on {target} (pid {pid}, {ctl}); this machine may go away"
    )
    return info


def _stage_keys(stage: Path, name: str, key: str) -> None:
    """The aios key and the cluster's pinned host keys, for the controller to reach the hosts."""
    keys = stage / "home" / "keys"
    keys.mkdir(parents=True)
    shutil.copyfile(key, keys / "aios_ed25519")
    os.chmod(keys / "aios_ed25519", 0o600)
    if Path(key + ".pub").is_file():
        shutil.copyfile(key + ".pub", keys / "aios_ed25519.pub")
    kh = cluster_dir(name) / "known_hosts"
    (stage / "home" / "clusters" / name).mkdir(parents=True)
    if kh.is_file():
        shutil.copyfile(kh, stage / "home" / "clusters" / name / "known_hosts")


def _stage_code(stage: Path, tmp: Path, spec: Any, cloud: str) -> None:
    """The job's code (a recreated cluster is re-synced from it), and this aios with its
    plugins."""
    # the code a recreated cluster is re-synced from
    tar = make_tarball(spec.workdir, tmp / "work.tar.gz", spec.excludes, spec.max_sync_mb * 2**20)
    (stage / "work").mkdir()
    with tarfile.open(tar.path) as t:
        t.extractall(stage / "work", filter="data")
    # this aios and its plugins
    b = build(spec.backend, cloud)
    for src, arc in b.files:
        dst = stage / "site" / Path(arc).relative_to(SITE)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
    for arc, text in b.generated.items():
        dst = stage / "site" / Path(arc).relative_to(SITE)
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(text)


def _stage_env(stage: Path, spec: Any) -> None:
    """``controller.env``: the job's ``--env`` values and forwarded variables, for the
    controller's reads of the checkpoint directory."""
    # the controller reads the job's checkpoint directory (the newest step at each end and
    # recovery) the way the job does: with the job's `--env` values (a storage endpoint, a
    # project) and forwarded variables (credentials). aios's own settings stay the job's.
    # Without them a bucket read went to the public endpoint and stalled each recovery for
    # a minute of the storage client's retries.
    forwarded = {k: v for k, v in spec.env.items() if not k.startswith("AIOS_")}
    forwarded |= {n: os.environ[n] for n in spec.forward_env if n in os.environ}
    env_path = stage / "controller.env"
    fd = os.open(env_path, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(forwarded.items())))


def _stage_store(
    stage: Path, store: Store, rec: ClusterRecord, job: JobRecord, spec: Any, ctl: str
) -> int:
    """The controller's own state database: the cluster and the job, pointing at the
    controller's paths. Returns the job's id there."""
    db = Store(stage / "home" / "state.db")
    try:
        db.claim_cluster(dataclasses.replace(rec, ssh_key=f"{ctl}/home/keys/aios_ed25519"))
        remote_spec = {**spec.to_dict(), "workdir": f"{ctl}/work"}
        rid = db.add_job(
            rec.name,
            job.command,
            backend=job.backend,
            managed=job.managed,
            max_restarts=job.max_restarts,
            checkpoint_dir=job.checkpoint_dir,
            spec=remote_spec,
        )
        db.update_job(rid, state=JOB_RUNNING)
        # the shape the job started on: the controller ends it and records the next ones
        for e in store.events(rec.name):
            if e.job_id == job.id and e.kind in (SHAPE, SHAPE_END):
                db.event(rec.name, e.kind, e.message, rid)
    finally:
        db.close()
    return rid


def controller_of(store: Store, name: str) -> dict[str, Any] | None:
    events = store.events(name, kind="controller")
    if not events:
        return None
    try:
        return json.loads(events[-1].message)
    except ValueError:
        return None


_READ = (
    "import json, sys; from aios_cloud.store import Store; from aios_cloud.shapes import job_shapes; "
    "s = Store(); n = sys.argv[1]; r = s.get_cluster(n); "
    "print(json.dumps({'cluster': r.state if r else 'DELETED', "
    "'jobs': [dict(id=j.id, state=j.state, command=j.command, restarts=j.restarts, max_restarts=j.max_restarts, "
    "exit_codes=j.exit_codes, shapes=job_shapes(s, n, j.id)) for j in s.jobs(n)], "
    "'recoveries': [dict(time=e.time, kind=e.kind, message=e.message) for e in s.events(n) "
    "if e.kind in ('preempted', 'unhealthy', 'recovered', 'recovery-failed', 'failover', 'maintenance', "
    "'grow')]}))"
)


def remote_status(
    rec: ClusterRecord, info: dict[str, Any], key: str | None
) -> dict[str, Any] | None:
    """The job's state, restarts and recoveries as the controller's own database has them (and
    whether the controller still runs); None when the controller cannot be reached."""
    host = parse_target(info["target"], rec.ssh_user or "aios")
    runner = _runner(rec.name, host, key)
    ctl = info["dir"]
    cmd = (
        f'AIOS_HOME={ctl}/home PYTHONPATH="{ctl}/site${{PYTHONPATH:+:$PYTHONPATH}}" {shlex.quote(info["python"])} '
        f"-c {shlex.quote(_READ)} {shlex.quote(rec.name)} && "
        f'if kill -0 "$(cat {ctl}/controller.pid)" 2>/dev/null; then echo CONTROLLER-RUNNING; '
        "else echo CONTROLLER-ENDED; fi"
    )
    try:
        r = runner.run_one(host, cmd, stream=False, timeout=120)
    except Exception:  # noqa: BLE001 - reported as unreachable
        return None
    if r.returncode != 0 or len(r.stdout) < 2:
        return None
    try:
        row = json.loads(r.stdout[-2])
    except ValueError:
        return None
    row["controller_running"] = r.stdout[-1].strip() == "CONTROLLER-RUNNING"
    return row


def stop_controller(rec: ClusterRecord, info: dict[str, Any], key: str | None, log: Log) -> bool:
    """Stop the controller's recovery loop (before `aios down`: it would otherwise recreate the
    cluster it sees disappear). Returns whether it was still running."""
    host = parse_target(info["target"], rec.ssh_user or "aios")
    runner = _runner(rec.name, host, key)
    ctl = info["dir"]
    cmd = (
        f'p=$(cat {ctl}/controller.pid 2>/dev/null); if [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then '
        f'kill -TERM "$p"; for i in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done; '
        f'kill -KILL "$p" 2>/dev/null; echo STOPPED; else echo NOT-RUNNING; fi'
    )
    r = runner.run_one(host, cmd, stream=False, timeout=60)
    runner.check([r], "controller stop")
    stopped = bool(r.stdout) and r.stdout[-1].strip() == "STOPPED"
    if stopped:
        log(f"stopped the controller of {rec.name} on {info['target']} (pid {info['pid']})")
    return stopped
