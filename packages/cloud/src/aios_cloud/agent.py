"""``python -m aios_cloud.agent AGENT_JSON``: the autostop/autodown agent on a cluster's head host.

``aios launch --autostop MINUTES [--autodown]`` (or ``aios autostop NAME MINUTES``) writes
``~/aios/<cluster>/agent.json`` on worker 0 and starts this agent there, detached (``setsid
nohup``), so it keeps watching when the laptop that launched the cluster sleeps or is gone.

Every ``poll`` seconds it looks at ``~/aios/<cluster>/jobs/*``: a job whose ``pid`` is alive and
that has no ``exit_code`` is running. When no job has run for ``idle_seconds`` it stops (or, with
``action: down``, deletes) the cluster through the cloud's own API with the provider aios
launched it with (the bundle ships aios and the cloud plugin to the hosts; on the cloud the
hosts use their service account / instance profile, never keys copied from the laptop), then
exits. ``agent.state`` (JSON) says what it saw last; ``agent.log`` what it did.

``agent.json``: ``cluster``, ``zone``, ``cloud``, ``action`` (``stop``/``down``),
``idle_seconds``, ``poll``, ``settings`` (the cloud's config section as the hosts must use it;
no secrets), ``root`` (the cluster directory).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from aios.config.schema import resolve

from aios_cloud.records import get_provider


def job_running(jobs: Path) -> bool:
    """Whether any job under ``jobs`` runs now (alive pid, no exit code)."""
    if not jobs.is_dir():
        return False
    for d in jobs.iterdir():
        if (d / "exit_code").exists():
            continue
        try:
            pid = int((d / "pid").read_text().strip())
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            continue
        except PermissionError:
            return True
    return False


def last_activity(jobs: Path, since: float) -> float:
    """The newest of ``since`` and every job's start/end time."""
    newest = since
    if jobs.is_dir():
        for d in jobs.iterdir():
            for name in ("exit_code", "pid"):
                try:
                    newest = max(newest, (d / name).stat().st_mtime)
                except OSError:
                    pass
    return newest


def provider_for(cfg: dict[str, Any]) -> Any:
    """The cloud provider as the hosts must use it: ``settings`` become ``AIOS_<CLOUD>__<KEY>``."""
    cloud = cfg["cloud"]
    environ = {
        f"AIOS_{cloud.upper()}__{k.upper()}": v if isinstance(v, str) else json.dumps(v)
        for k, v in (cfg.get("settings") or {}).items()
        if v is not None
    }
    config = resolve(environ=environ, check_backend=False)
    return get_provider(cloud, config)


def act(cfg: dict[str, Any], log: Any) -> None:
    provider = provider_for(cfg)
    if cfg["action"] == "down":
        log(f"deleting cluster {cfg['cluster']} (autodown)")
        provider.delete(cfg["cluster"], cfg.get("zone"))
    else:
        log(f"stopping cluster {cfg['cluster']} (autostop)")
        provider.stop(cfg["cluster"], cfg.get("zone"))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path = Path(argv[0])
    cfg = json.loads(path.read_text())
    root = Path(cfg.get("root") or path.parent)
    jobs = root / "jobs"
    state_file = root / "agent.state"
    idle_after = float(cfg["idle_seconds"])
    poll = float(cfg.get("poll", 30.0))
    started = time.time()

    def log(msg: str) -> None:
        print(
            f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} [aios agent] {msg}", flush=True
        )

    log(f"watching {jobs}: {cfg['action']} after {idle_after:g}s without a running job")
    failures = 0
    while True:
        if not path.exists():  # `aios autostop NAME --cancel` removed the config
            log("agent config removed; exiting")
            return 0
        now = time.time()
        running = job_running(jobs)
        idle_since = now if running else last_activity(jobs, started)
        state = {
            "time": now,
            "running": running,
            "idle_since": idle_since,
            "action": cfg["action"],
            "idle_seconds": idle_after,
            "pid": os.getpid(),
        }
        tmp = state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, state_file)
        if not running and now - idle_since >= idle_after:
            log(f"idle for {now - idle_since:.0f}s")
            try:
                act(cfg, log)
                log("done")
                return 0
            except Exception as exc:  # noqa: BLE001 - keep trying: an idle cluster costs money
                failures += 1
                log(f"{cfg['action']} failed ({type(exc).__name__}: {str(exc)[:300]}); retrying")
                time.sleep(min(300.0, poll * 2 ** min(failures, 5)))
                continue
        time.sleep(poll)


if __name__ == "__main__":
    sys.exit(main())
