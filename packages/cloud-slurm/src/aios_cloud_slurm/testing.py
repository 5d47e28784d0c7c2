"""A real Slurm cluster on this machine for tests: ``munged``, ``slurmctld`` and N ``slurmd``
daemons (Debian ``slurm-wlm`` + ``munge``), configured in a temporary directory.

Each compute node is its own ``slurmd -N nodeK`` with its own port, spool and log; all of them
run here (``NodeHostname=localhost``). Node names are loopback addresses (``127.0.0.1``,
``127.0.0.2``, ...): Slurm reports them compressed (``SLURM_JOB_NODELIST=127.0.0.[1-2]``), and
the master address ``aios-run`` expands from it (the first node) is reachable without touching
``/etc/hosts``. Nothing outside the directory changes; :meth:`SlurmCluster.close` stops
every daemon it started (by pid) and every job.

GPUs: with ``gpu_nodes`` > 0 a second partition (``gpu``) of that many more nodes declares
``Gres=gpu:<gpus>`` each (``GresTypes=gpu``), backed by a ``gres.conf`` whose ``File=`` entries
are character devices made for the test in ``<dir>/dev`` (``mknod``, /dev/null's major and minor:
nothing real is behind them). Slurm grants them as it grants real GPUs: a job that asks for them
gets ``SLURM_GPUS_ON_NODE`` and ``CUDA_VISIBLE_DEVICES``; "Jobs will not be allocated any generic
resources unless specifically requested at job submit time"
(https://slurm.schedmd.com/gres.html). The ``debug`` partition's nodes have no GPUs.

CPUs: ``TaskPlugin=task/affinity`` binds every task to the CPUs Slurm allocated it
(``sched_getaffinity`` in the task shows them), as production clusters do; ``task/cgroup``
would need a writable cgroup hierarchy and ``proctrack/cgroup``, which a container does not
give. Each node declares ``cpus`` CPUs, at most this machine's own (a task is bound to real
CPU ids).

Usage::

    reason = slurm_unavailable_reason()
    if reason: pytest.skip(reason)
    with SlurmCluster(tmp_dir, nodes=2) as cluster:
        subprocess.run(["srun", "-N2", "hostname"], env=cluster.env())
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

BINARIES = (
    "munged",
    "slurmctld",
    "slurmd",
    "sbatch",
    "srun",
    "squeue",
    "scontrol",
    "scancel",
    "sinfo",
)
PLUGIN_DIRS = (
    "/usr/lib/x86_64-linux-gnu/slurm-wlm",
    "/usr/lib/aarch64-linux-gnu/slurm-wlm",
    "/usr/lib64/slurm",
    "/usr/lib/slurm",
)


def _which(name: str) -> str | None:
    return shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.path.exists(p)), None
    )


def slurm_unavailable_reason() -> str:
    """Empty when a test Slurm can start here, else why not (with the install line)."""
    missing = [b for b in BINARIES if not _which(b)]
    if missing:
        return f"Slurm binaries missing ({', '.join(missing)}): apt-get install -y slurm-wlm munge"
    if os.geteuid() != 0:
        return "the test Slurm runs its daemons as root (SlurmUser=root): run the tests as root"
    return ""


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def _node_names(n: int) -> list[str]:
    return [f"127.0.0.{i + 1}" for i in range(n)]


class SlurmCluster:
    def __init__(
        self,
        workdir: str | os.PathLike[str],
        nodes: int = 2,
        cpus: int = 2,
        partition: str = "debug",
        timeout: float = 60.0,
        gpu_nodes: int = 0,
        gpus: int = 2,
        gpu_partition: str = "gpu",
    ) -> None:
        self.dir = Path(workdir)
        names = _node_names(nodes + gpu_nodes)
        self.cpu_nodes, self.gpu_nodes = names[:nodes], names[nodes:]
        self.nodes = names
        # bound tasks need real CPU ids: never more per node than this machine lets us use
        self.cpus = min(cpus, len(os.sched_getaffinity(0)))
        self.gpus = gpus
        self.partition = partition
        self.gpu_partition = gpu_partition
        self.procs: list[int] = []
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o755)
        for sub in ("run", "log", "state", "spool"):
            (self.dir / sub).mkdir(exist_ok=True)
        for n in self.nodes:
            (self.dir / "spool" / n).mkdir(exist_ok=True)
        try:
            self._munge()
            self._config()
            self._start(timeout)
        except BaseException:
            self.close()
            raise

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for Slurm client commands (``SLURM_CONF`` pointing here; no stale ``SLURM_*``)."""
        env = {
            k: v
            for k, v in (os.environ if base is None else base).items()
            if not k.startswith("SLURM_")
        }
        env["SLURM_CONF"] = str(self.conf)
        return env

    def _munge(self) -> None:
        key = self.dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        self.munge_socket = self.dir / "run" / "munge.sock"
        subprocess.run(
            [
                _which("munged") or "munged",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={self.dir / 'run' / 'munged.pid'}",
                f"--log-file={self.dir / 'log' / 'munged.log'}",
                f"--seed-file={self.dir / 'state' / 'munged.seed'}",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )
        self._track(self.dir / "run" / "munged.pid")

    def _config(self) -> None:
        ctld, *node_ports = _free_ports(1 + len(self.nodes))
        self.ctld_port = ctld
        plugin_dir = next((d for d in PLUGIN_DIRS if os.path.isdir(d)), PLUGIN_DIRS[0])
        d = self.dir
        lines = [
            "ClusterName=aiostest",
            f"SlurmctldHost={socket.gethostname()}(127.0.0.1)",
            f"SlurmctldPort={ctld}",
            "AuthType=auth/munge",
            # cred_expire: the job credential's lifetime, which is also how long Slurm holds a
            # requeued job before it may start again (now + cred_expire + 1; default 120 s). 30 s
            # still covers a step launch on a loaded 2-core machine; a requeue waits 31 s, not 121
            f"AuthInfo=socket={self.munge_socket},cred_expire=30",
            "CredType=cred/munge",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}/%n",
            f"SlurmctldPidFile={d / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'run'}/slurmd-%n.pid",
            f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'log'}/slurmd-%n.log",
            "ProctrackType=proctrack/pgid",
            "TaskPlugin=task/affinity",
            "SwitchType=switch/none",
            "MpiDefault=none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=120",
            "InactiveLimit=0",
            "MinJobAge=600",
            "KillWait=30",
            "MessageTimeout=30",
            f"PluginDir={plugin_dir}",
            "MailProg=/bin/true",
        ]
        if self.gpu_nodes:
            lines.append("GresTypes=gpu")
            self._gres()
        for name, port in zip(self.nodes, node_ports, strict=True):
            gres = f" Gres=gpu:{self.gpus}" if name in self.gpu_nodes else ""
            lines.append(
                f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 CPUs={self.cpus} "
                f"RealMemory=1000 Port={port}{gres} State=UNKNOWN"
            )
        lines.append(
            f"PartitionName={self.partition} Nodes={','.join(self.cpu_nodes)} Default=YES "
            "MaxTime=INFINITE State=UP"
        )
        if self.gpu_nodes:
            lines.append(
                f"PartitionName={self.gpu_partition} Nodes={','.join(self.gpu_nodes)} "
                "MaxTime=INFINITE State=UP"
            )
        self.conf.write_text("\n".join(lines) + "\n")

    def _gres(self) -> None:
        """gres.conf: each GPU node's devices, character devices made here (not real GPUs)."""
        dev = self.dir / "dev"
        dev.mkdir(exist_ok=True)
        null = os.stat("/dev/null").st_rdev
        lines = ["AutoDetect=off"]
        for k, name in enumerate(self.gpu_nodes):
            for i in range(self.gpus):
                path = dev / f"node{k}-gpu{i}"
                if not path.exists():
                    os.mknod(path, 0o666 | stat.S_IFCHR, null)
            lines.append(f"NodeName={name} Name=gpu File={dev}/node{k}-gpu[0-{self.gpus - 1}]")
        (self.dir / "gres.conf").write_text("\n".join(lines) + "\n")

    def _track(self, pidfile: Path, wait: float = 10.0) -> None:
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                pid = int(pidfile.read_text().strip())
                self.procs.append(pid)
                return
            except (OSError, ValueError):
                time.sleep(0.1)
        raise RuntimeError(f"{pidfile} did not appear; see {self.dir / 'log'}")

    def _start(self, timeout: float) -> None:
        env = self.env()
        subprocess.run(
            [_which("slurmctld") or "slurmctld", "-c", "-f", str(self.conf)],
            check=True,
            env=env,
            capture_output=True,
            timeout=60,
        )
        self._track(self.dir / "run" / "slurmctld.pid")
        for n in self.nodes:
            subprocess.run(
                [_which("slurmd") or "slurmd", "-f", str(self.conf), "-N", n],
                check=True,
                env=env,
                capture_output=True,
                timeout=60,
            )
            self._track(self.dir / "run" / f"slurmd-{n}.pid")
        deadline = time.monotonic() + timeout
        out = ""
        while time.monotonic() < deadline:
            r = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%N %t"],
                env=env,
                capture_output=True,
                text=True,
                timeout=30,
            )
            out = r.stdout
            states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
            if len(states) == len(self.nodes) and all(
                s in ("idle", "mix", "alloc") for s in states.values()
            ):
                return
            time.sleep(0.5)
        raise RuntimeError(
            f"Slurm nodes did not become idle in {timeout}s: {out!r}; logs in {self.dir / 'log'}"
        )

    def squeue(self) -> str:
        return subprocess.run(
            ["squeue", "-h", "-o", "%i %T %R"],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout

    def close(self) -> None:
        env = self.env()
        if len(self.procs) > 1:  # slurmctld is up: cancel every job first
            for part in (self.partition, self.gpu_partition if self.gpu_nodes else None):
                if part is None:
                    continue
                try:
                    subprocess.run(
                        ["scancel", "--partition", part],
                        env=env,
                        capture_output=True,
                        timeout=20,
                    )
                except (OSError, subprocess.TimeoutExpired):
                    pass
        # a job still ending has its slurmstepd, which outlives the daemons (its parent is init):
        # found by this cluster's slurm.conf in its environment, and stopped with them
        self.procs += [pid for pid in self._stepds() if pid not in self.procs]
        for pid in reversed(self.procs):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 15
        for pid in self.procs:
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.procs = []

    def _stepds(self) -> list[int]:
        """The ``slurmstepd`` processes of this cluster's jobs (slurmd passes its environment,
        ``SLURM_CONF`` naming this directory, on to them)."""
        want = f"SLURM_CONF={self.conf}".encode()
        found = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                if "slurmstepd" not in os.path.basename(os.readlink(d / "exe")):
                    continue
                if want in (d / "environ").read_bytes().split(b"\0"):
                    found.append(int(d.name))
            except OSError:  # gone, or not ours to read
                continue
        return found

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
