"""``aios launch --cloud slurm``: a batch scheduler behind the cloud commands.

A Slurm "cluster" in the aios store is a named job line: ``aios launch --cloud slurm --name N``
syncs the code to ``<slurm.remote_dir>/N/code`` (a filesystem every node mounts), writes
``N/jobs/<id>/job.sbatch`` (:mod:`aios_cloud_slurm.script`) and submits it with ``sbatch``, on
this machine or on ``slurm.login`` over ssh. ``aios status [--refresh]`` shows the Slurm job
state, ``aios logs N [-f]`` its output, ``aios cancel N`` / ``aios stop N`` cancel it
(``scancel``), ``aios down N`` cancels and forgets it (files on the cluster are kept: they are
the user's outputs and checkpoints). ``aios catalog --cloud slurm`` lists the partitions;
``aios cost`` says "n/a (your cluster)".

Bad input is one line and exit 2, with nothing queued: no sbatch, an unknown partition, a job
sbatch rejects, an unreachable login node.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable
from typing import Any

from aios_cloud.features import COST_LIMIT, SETUP, SSH_LOGIN, ZONE
from aios_cloud.provider.data import CatalogEntry, CloudCommand, ClusterInfo
from aios_cloud.provider.errors import CloudError
from aios_cloud.provider.scheduler import SchedulerProvider
from aios_cloud.request import LaunchRequest
from aios_cloud.store import ClusterRecord, JobRecord, Store

from aios_cloud_slurm import launch as slurm_launch
from aios_cloud_slurm.settings import SlurmSettings
from aios_cloud_slurm.shell import Shell
from aios_cloud_slurm.states import FINAL_STATES, gres_gpus, parse_config, parse_kv

PRICE_NOTE = "n/a (your cluster)"


def _settings(config: Any) -> Any:
    section = config.section("slurm") if config is not None else None
    return section if section is not None else SlurmSettings()


class SlurmProvider(SchedulerProvider):
    name = "slurm"
    storage_scheme = ""
    cli = "sbatch"
    # a job on the cluster's nodes: no capacity, images, disks, accounts, hosts or controller
    # of aios's to choose (--zone, like -a, names the partition)
    features = frozenset({ZONE, SETUP})
    feature_hints = {
        SSH_LOGIN: "set slurm.login / slurm.ssh_key instead",
        COST_LIMIT: "bound the job with the scheduler's own time limit (slurm.time)",
    }

    def __init__(self, config: Any = None) -> None:
        self.config = config
        self.settings = _settings(config)
        s = self.settings
        self.shell = Shell(s.login, s.ssh_key, s.ssh_port, list(s.ssh_options), dict(s.login_env))

    # ------------------------------------------------------------------ cluster facts
    def require_slurm(self) -> None:
        conf = os.environ.get("SLURM_CONF")
        if not self.shell.login and conf and not os.path.exists(conf):
            # the client tools would retry reading it for a minute before giving up
            raise CloudError(
                f"SLURM_CONF={conf} does not exist: no Slurm cluster is configured here",
                "point SLURM_CONF at the cluster's slurm.conf (or unset it), or set slurm.login "
                "to a login node (AIOS_SLURM__LOGIN=user@host)",
            )
        r = self.shell.run(
            "command -v sbatch && command -v squeue && command -v scontrol && command -v sinfo",
            timeout=60,
        )
        if self.shell.login and r.returncode == 255:
            err = r.stderr.decode(errors="replace").strip().splitlines()
            raise CloudError(
                f"cannot reach the Slurm login node {self.shell.login}: {err[-1] if err else 'ssh failed'}",
                "check slurm.login, slurm.ssh_key and that `ssh LOGIN` works",
            )
        if r.returncode != 0:
            where = f"on the login node {self.shell.login}" if self.shell.login else "on PATH"
            raise CloudError(
                f"no Slurm {where}: sbatch/squeue/scontrol/sinfo not found",
                "install the Slurm client tools (apt-get install slurm-client), or set "
                "slurm.login to a login node (AIOS_SLURM__LOGIN=user@host)",
            )

    def partitions(self) -> list[dict[str, Any]]:
        """``sinfo`` per partition: name, default, nodes, cpus/node, memory MB/node, gres, time limit, state."""
        text = self.shell.out("sinfo -h -o '%P|%D|%c|%m|%G|%l|%a'", "sinfo")
        out: dict[str, dict[str, Any]] = {}
        for line in text.splitlines():
            parts = line.strip().split("|")
            if len(parts) < 7:
                continue
            name, nodes, cpus, mem, gres, limit, avail = parts[:7]
            default = name.endswith("*")
            name = name.rstrip("*")
            p = out.setdefault(
                name,
                {
                    "name": name,
                    "default": default,
                    "nodes": 0,
                    "cpus": 0,
                    "cpus_min": 0,
                    "mem_mb": 0,
                    "gres": gres,
                    "timelimit": limit,
                    "avail": avail,
                },
            )
            p["nodes"] += int(nodes) if nodes.isdigit() else 0
            c = int(re.sub(r"\D.*", "", cpus) or 0)
            p["cpus"] = max(p["cpus"], c)
            p["cpus_min"] = min(p["cpus_min"] or c, c)
            p["mem_mb"] = max(p["mem_mb"], int(re.sub(r"\D.*", "", mem) or 0))
        return list(out.values())

    def cluster_config(self) -> dict[str, str]:
        """``scontrol show config``: SelectType and GresTypes decide how GPUs are asked for."""
        return parse_config(self.shell.out("scontrol show config", "scontrol show config"))

    def resolve_partition(self, wanted: str | None) -> dict[str, Any]:
        parts = self.partitions()
        if not parts:
            raise CloudError(
                f"the Slurm cluster {self.shell.where.removeprefix('on ')} has no partitions",
                "ask its admin, or check `sinfo`",
            )
        if wanted:
            for p in parts:
                if p["name"] == wanted:
                    return p
            raise CloudError(
                f"unknown Slurm partition '{wanted}'",
                f"pick one of: {', '.join(p['name'] for p in parts)} (see `sinfo`)",
            )
        for p in parts:
            if p["default"]:
                return p
        raise CloudError(
            "the Slurm cluster has no default partition",
            f"pass -a PARTITION ({', '.join(p['name'] for p in parts)})",
        )

    # ------------------------------------------------------------------ CloudProvider
    def catalog(self) -> list[CatalogEntry]:
        self.require_slurm()
        out = []
        for p in self.partitions():
            gpus = gres_gpus(p["gres"])
            per_node = gpus or p["cpus"]
            out.append(
                CatalogEntry(
                    cloud=self.name,
                    accelerator=p["name"],
                    devices=per_node * p["nodes"],
                    device_kind=f"GPU ({p['gres']})" if gpus else "CPU core",
                    memory_gb=round(p["mem_mb"] / 1024, 1) if not gpus else 0.0,
                    hosts=p["nodes"],
                    runtime=f"time limit {p['timelimit']}",
                    zones=(p["name"],),
                    backend="cuda" if gpus else "cpu",
                    extra={
                        "vcpus": p["cpus"],
                        "ram_gib": round(p["mem_mb"] / 1024, 1),
                        "price": PRICE_NOTE,
                        "default": p["default"],
                        "state": p["avail"],
                        "gres": p["gres"],
                    },
                )
            )
        return out

    def entry(self, accelerator: str) -> CatalogEntry:
        for e in self.catalog():
            if e.accelerator == accelerator:
                return e
        return super().entry(accelerator)

    def job_info(self, job_id: str) -> dict[str, str] | None:
        r = self.shell.run(f"scontrol show job -o {shlex.quote(job_id)}", timeout=60)
        text = r.stdout.decode(errors="replace").strip()
        if r.returncode != 0 or not text:
            return None
        return parse_kv(text.splitlines()[0])

    def _record(self, name: str) -> Any:
        return Store().get_cluster(name)

    def describe(self, name: str, zone: str | None) -> ClusterInfo | None:
        rec = self._record(name)
        if rec is None or not rec.request.get("slurm_job_id"):
            return None
        job_id = rec.request["slurm_job_id"]
        info = self.job_info(job_id)
        state = (
            info.get("JobState", "UNKNOWN")
            if info
            else self._state_from_files(rec.request) or "GONE"
        )
        return ClusterInfo(
            name=name,
            cloud=self.name,
            zone=rec.zone,
            accelerator=rec.accelerator,
            state=state,
            raw={
                "slurm_job_id": job_id,
                "restarts": (info or {}).get("Restarts"),
                "nodes": (info or {}).get("NodeList"),
                "exit_code": (info or {}).get("ExitCode"),
                "reason": (info or {}).get("Reason"),
            },
        )

    def _state_from_files(self, request: dict[str, Any]) -> str | None:
        code = self.final_exit(request)
        if code is None:
            return None
        return "COMPLETED" if code == 0 else "FAILED"

    def final_exit(self, request: dict[str, Any]) -> int | None:
        job_dir = request.get("job_dir")
        if not job_dir:
            return None
        r = self.shell.run(
            f"cd {shlex.quote(job_dir)} 2>/dev/null && ls exit.* 2>/dev/null | sort -t. -k2 "
            "-n | tail -n 1 | xargs -r cat",
            timeout=60,
        )
        text = r.stdout.decode().strip()
        return int(text) if text.lstrip("-").isdigit() else None

    def start(self, name: str, zone: str | None) -> ClusterInfo:
        raise CloudError(
            "a Slurm job cannot be restarted in place",
            "launch it again with `aios launch --cloud slurm --name NAME ...`",
        )

    def cancel(self, name: str) -> None:
        rec = self._record(name)
        job_id = rec.request.get("slurm_job_id") if rec else None
        if not job_id:
            return
        info = self.job_info(job_id)
        if info is not None and info.get("JobState") not in FINAL_STATES:
            self.shell.out(f"scancel {shlex.quote(job_id)}", "scancel")

    def render(self, action: str, name: str, zone: str | None) -> list[CloudCommand]:
        rec = self._record(name)
        job = rec.request.get("slurm_job_id", "<job id>") if rec else "<job id>"
        if action in ("stop", "delete"):
            return [
                CloudCommand(
                    ["scancel", str(job)], "cancel the job (its files stay on the cluster)"
                )
            ]
        if action == "describe":
            return [CloudCommand(["scontrol", "show", "job", str(job)])]
        if action == "list":
            return [CloudCommand(["squeue", "--me"])]
        raise CloudError(
            f"'{action}' does not apply to a Slurm job", "use launch/status/logs/cancel/down"
        )

    def describe_credentials(self) -> str:
        return f"ssh {self.shell.login}" if self.shell.login else "local Slurm (munge)"

    def python(self, accelerator: str, backend: str | None = None) -> str:
        return self.settings.python

    # ------------------------------------------------------------------ launch
    def launch_job(
        self, request: LaunchRequest, store: Store | None, log: Callable[[str], None]
    ) -> int:
        return slurm_launch.launch(self, request, store, log)

    def job_logs(
        self,
        rec: ClusterRecord,
        job: JobRecord,
        follow: bool,
        dry_run: bool,
        echo: Callable[[str], None],
    ) -> int:
        return slurm_launch.logs(self, rec, job, follow, dry_run, echo)


__all__ = ["SlurmProvider", "PRICE_NOTE"]
