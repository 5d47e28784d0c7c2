"""Real OpenSSH ``sshd`` hosts for tests: stand-ins for the machines of a cloud cluster.

Each host is a real ``/usr/sbin/sshd`` (Debian package ``openssh-server``) with its own host
key, its own ``$HOME`` directory and, when network namespaces are available (root, ``ip netns``),
its own network namespace: hosts sit on a private ``/24`` behind a bridge in a separate
"switch" namespace, so they reach each other (a worker connects to worker 0's address for the
rendezvous) and this machine reaches them through one veth pair. Nothing in the root namespace
changes except that one veth end and its route; all is removed by :meth:`SshdCluster.close`.
Without netns support the hosts listen on ``127.0.0.1`` on distinct ports.

Usage (pytest)::

    from aios_cloud.testing.sshd import SshdCluster, sshd_unavailable_reason

    @pytest.fixture
    def hosts(tmp_path):
        reason = sshd_unavailable_reason()
        if reason:
            pytest.skip(reason)
        with SshdCluster(2, tmp_path / "sshd") as cluster:
            yield cluster

    def test_it(hosts):
        h = hosts.hosts[0]
        out = subprocess.run(hosts.ssh_argv(h) + ["echo hi"], capture_output=True, text=True)

API:

* :class:`SshdCluster` ``(n, workdir, netns=None, user=None, pci=None, forwarded=False,
  ports=None)``: start ``n`` hosts; ``forwarded``: behind one gateway's port forwards (``.ip`` is
  the gateway, ``.port`` 2201+i; inside each host listens on 22 at ``.internal_ip``, or on
  ``ports[i]``: namespace mode only);
  ``pci``: each host's PCI functions ``[(vendor, device), ...]`` (default :data:`GCE_VM_PCI`, a
  GCE VM with its gVNIC; namespace mode bind-mounts them over ``/sys/bus/pci/devices``); ``.hosts``,
  ``.client_key`` (private key path), ``.user``, ``.ssh_argv(host)``, ``.close()``; a context
  manager. ``netns=None`` uses namespaces when possible, ``True`` requires them.
* :class:`SshdHost`: ``name, worker_id, ip, port, internal_ip, home, netns``;
  ``stop()`` (sshd down, every process of the host killed: a preemption), ``start(new_host_key=True)``
  (back up, with a new host key as after a cloud stop/start), ``kill_processes()``,
  ``host_key_fingerprint()``, ``running``.
* ``SshdCluster.service_ip`` / ``popen_service(argv)`` / ``wait_port(port)``: run a server (an
  object-store emulator, a metadata server) where both this machine and every host reach it (in
  the switch namespace, or on loopback); stopped by ``close()``.
* In namespace mode each host also has its own UTS namespace: ``hostname`` is
  ``aios-<tag>-w<N>`` and resolves to the host's address (``/etc/netns/<ns>/hosts``), as on a cloud
  VM; torch's c10d rendezvous needs that.
* :func:`netns_available` says whether namespace mode can run here.
* :func:`sshd_unavailable_reason` returns ``""`` when sshd hosts can run here, else why not
  (for ``pytest.skip``).

The machines share this machine's filesystem; ``$HOME`` differs per host (``SetEnv HOME=``), so
code that keeps its files under ``~`` (as aios does) sees one home per host.

Cron, as on the cloud images (Ubuntu server images run cron): each host has a ``crontab``
command (``-l``, ``-r``, ``-`` / FILE, as crontab(1)) keeping the user's table in its home, and
:meth:`SshdHost.start` (the host booting) runs the table's ``@reboot`` entries, as the cron daemon
does when it starts (crontab(5): "@reboot: Run once, at startup"). This machine's own cron is
never touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"
IP = shutil.which("ip") or "/usr/sbin/ip"
_LOCK = Path("/tmp/aios-testing-sshd.lock")
NETNS_ETC = Path("/etc/netns")  # `ip netns exec NS` bind-mounts /etc/netns/NS/* over /etc/*


# The PCI functions of a Compute Engine VM's guest without accelerators: gVNIC (Google's vendor id
# 0x1ae0, device 0x0042; https://cloud.google.com/compute/docs/networking/using-gvnic, on every
# third-generation and later machine series) and a virtio SCSI controller (0x1af4:0x1004).
# A TPU VM adds one TPU function per chip, e.g. ("0x1ae0", "0x006f") for v6e.
GCE_VM_PCI: tuple[tuple[str, str], ...] = (("0x1ae0", "0x0042"), ("0x1af4", "0x1004"))
_PCI_CLASS = {("0x1ae0", "0x0042"): "0x020000", ("0x1af4", "0x1004"): "0x010000"}


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=60)


def sshd_unavailable_reason() -> str:
    """Empty when sshd test hosts can start here; otherwise the reason (install hint)."""
    if not os.path.exists(SSHD):
        return "sshd not found: apt-get install openssh-server"
    if not shutil.which("ssh"):
        return "ssh client not found: apt-get install openssh-client"
    return ""


def netns_available() -> bool:
    if os.geteuid() != 0 or not os.path.exists(IP):
        return False
    name = f"aiosprobe{os.getpid()}"
    r = _run([IP, "netns", "add", name], check=False)
    if r.returncode != 0:
        return False
    _run([IP, "netns", "del", name], check=False)
    return True


from aios.testing import find_free_port as _free_port  # noqa: E402


@dataclass
class SshdHost:
    """One sshd host. ``ip``/``port`` are what a client connects to; ``internal_ip`` is what the
    other hosts use."""

    name: str
    worker_id: int
    ip: str
    port: int
    home: Path
    confdir: Path
    authorized_keys: Path
    netns: str | None = None
    internal_ip: str | None = None
    hostname: str | None = None
    #: the host's PCI functions as ``(vendor, device)``, seen at ``/sys/bus/pci/devices`` by
    #: everything that runs on the host (namespace mode; see :data:`GCE_VM_PCI`)
    pci: list[tuple[str, str]] = field(default_factory=list)
    #: where sshd itself listens when ``ip``/``port`` are a gateway's forward (forwarded mode)
    sshd_ip: str | None = None
    sshd_port: int | None = None
    #: sshd's LogLevel (its log is ``confdir/sshd.log``); INFO logs each refused login
    log_level: str = "ERROR"
    proc: subprocess.Popen | None = field(default=None, repr=False)

    # ------------------------------------------------------------------ lifecycle
    def _keygen(self) -> None:
        key = self.confdir / "ssh_host_ed25519_key"
        for p in (key, key.with_suffix(".pub")):
            p.unlink(missing_ok=True)
        _run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", str(key), "-C", self.name])

    def _config(self) -> Path:
        cfg = self.confdir / "sshd_config"
        cfg.write_text(
            "\n".join(
                [
                    f"Port {self.sshd_port or self.port}",
                    f"ListenAddress {self.sshd_ip or self.ip}",
                    f"HostKey {self.confdir / 'ssh_host_ed25519_key'}",
                    # the cluster's keys, and the host's own ~/.ssh/authorized_keys (where the
                    # head host installs its key for the other hosts), as sshd's default
                    # ".ssh/authorized_keys" on a real machine:
                    # https://man.openbsd.org/sshd_config#AuthorizedKeysFile
                    f"AuthorizedKeysFile {self.authorized_keys} {self.home}/.ssh/authorized_keys",
                    f"PidFile {self.confdir / 'sshd.pid'}",
                    "PermitRootLogin prohibit-password",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    "MaxStartups 200",
                    "MaxSessions 100",
                    f"LogLevel {self.log_level}",
                    f"SetEnv HOME={self.home} AIOS_TEST_HOST={self.name} PATH={self._path()}",
                    "Subsystem sftp internal-sftp",
                    "",
                ]
            )
        )
        return cfg

    def _pci_tree(self) -> Path:
        """The host's ``/sys/bus/pci/devices``: one directory per function with its ``vendor``
        and ``device`` files, as sysfs shows them (https://docs.kernel.org/PCI/sysfs-pci.html)."""
        root = self.confdir / "pci"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        for i, (vendor, device) in enumerate(self.pci):
            fn = root / f"0000:00:{4 + i:02x}.0"
            fn.mkdir()
            (fn / "vendor").write_text(vendor + "\n")
            (fn / "device").write_text(device + "\n")
            # the PCI class as sysfs has it (gloo reads every device's class to place NICs):
            # network controller for gVNIC, processing accelerator for a TPU, storage else
            cls = _PCI_CLASS.get((vendor, device)) or (
                "0x120000" if vendor == "0x1ae0" else "0x010000"
            )
            (fn / "class").write_text(cls + "\n")
        return root

    # ------------------------------------------------------------------ cron
    CRONTAB = ".aios-test-crontab"  # the user's table (crontab(1) keeps it in /var/spool/cron)

    def _path(self) -> str:
        """The hosts' PATH: sshd's default, with the host's own ``crontab`` first."""
        bindir = self.confdir / "bin"
        bindir.mkdir(parents=True, exist_ok=True)
        tool = bindir / "crontab"
        tool.write_text(
            "#!/bin/bash\n"
            "# crontab(1) of an aios test host: the table is $HOME/" + self.CRONTAB + "\n"
            f'f="$HOME/{self.CRONTAB}"\n'
            'case "${1:--}" in\n'
            '  -l) [ -f "$f" ] && exec cat "$f"; echo "no crontab for $(id -un)" >&2; exit 1;;\n'
            '  -r) rm -f "$f";;\n'
            '  -) cat > "$f.tmp" && mv "$f.tmp" "$f";;\n'
            '  *) cp "$1" "$f";;\n'
            "esac\n"
        )
        tool.chmod(0o755)
        return f"{bindir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

    def cron_table(self) -> str:
        """The host user's crontab ('' when none)."""
        f = self.home / self.CRONTAB
        return f.read_text() if f.exists() else ""

    def _run_reboot_jobs(self) -> None:
        """What the cron daemon does when the host boots: run every ``@reboot`` entry, with the
        user's environment, in the host's network namespace."""
        env = {"HOME": str(self.home), "AIOS_TEST_HOST": self.name, "PATH": self._path()}
        for line in self.cron_table().splitlines():
            if not line.startswith("@reboot"):
                continue
            argv = ["/bin/sh", "-c", line.removeprefix("@reboot").strip()]
            if self.netns:
                argv = [IP, "netns", "exec", self.netns, *argv]
            subprocess.Popen(
                argv,
                env=env,
                cwd=str(self.home),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )

    def start(self, new_host_key: bool = True, timeout: float = 15.0) -> None:
        """Start sshd (again). ``new_host_key``: a fresh host key, as after a cloud stop/start."""
        if self.running:
            return
        key = self.confdir / "ssh_host_ed25519_key"
        if new_host_key or not key.exists():
            self._keygen()
        cfg = self._config()
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege separation dir
        argv = [SSHD, "-D", "-e", "-f", str(cfg)]
        if self.netns:
            # own UTS namespace: the host has its own hostname, which resolves to its address
            # through /etc/netns/<ns>/hosts (bind-mounted over /etc/hosts by `ip netns exec`),
            # as on a cloud VM (torch's c10d rendezvous relies on that)
            inner = " ".join(shlex.quote(a) for a in argv)
            # `ip netns exec` gives the host its own mount namespace: its PCI bus is bind-mounted
            # there, so every session sshd starts sees the host's devices, never this machine's
            pci = shlex.quote(str(self._pci_tree()))
            argv = [
                IP,
                "netns",
                "exec",
                self.netns,
                "unshare",
                "--uts",
                "sh",
                "-c",
                f"mount --bind {pci} /sys/bus/pci/devices && "
                f"hostname {shlex.quote(self.hostname or self.name)} && exec {inner}",
            ]
        log = open(self.confdir / "sshd.log", "ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"sshd for {self.name} exited: {(self.confdir / 'sshd.log').read_text()[-2000:]}"
                )
            if self._port_open():
                self._run_reboot_jobs()  # the host booted: cron starts
                return
            time.sleep(0.05)
        raise RuntimeError(f"sshd for {self.name} did not listen on {self.ip}:{self.port}")

    def _port_open(self) -> bool:
        try:
            with socket.create_connection((self.ip, self.port), timeout=0.5):
                return True
        except OSError:
            return False

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _host_pids(self) -> set[int]:
        """Processes that belong to this host: everything in its netns, or (loopback mode) every
        process whose environment names this host."""
        pids: set[int] = set()
        if self.netns:
            r = _run([IP, "netns", "pids", self.netns], check=False)
            pids.update(int(p) for p in r.stdout.split() if p.isdigit())
        marker = f"AIOS_TEST_HOST={self.name}".encode()
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                env = (d / "environ").read_bytes()
            except OSError:
                continue
            if marker in env.split(b"\0"):
                pids.add(int(d.name))
        pids.discard(os.getpid())
        return pids

    def kill_processes(self) -> int:
        """Kill every process running on this host except sshd itself; returns how many."""
        keep = {self.proc.pid} if self.running and self.proc else set()
        pids = self._host_pids() - keep
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)

    def stop(self) -> None:
        """Take the host down like a preemption: sshd and every process on the host die."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                self.proc.wait(timeout=10)
        for _ in range(3):
            if not self.kill_processes():
                break
            time.sleep(0.1)
        self.proc = None

    def host_key_fingerprint(self) -> str:
        r = _run([SSH_KEYGEN, "-lf", str(self.confdir / "ssh_host_ed25519_key.pub")])
        return r.stdout.split()[1]

    def host_public_key(self) -> str:
        return (self.confdir / "ssh_host_ed25519_key.pub").read_text().strip()


class SshdCluster:
    """``n`` sshd hosts reachable with one client key. See the module docstring."""

    def __init__(
        self,
        n: int,
        workdir: str | os.PathLike[str],
        netns: bool | None = None,
        user: str | None = None,
        pci: list[list[tuple[str, str]]] | None = None,
        forwarded: bool = False,
        ports: dict[int, int] | None = None,
    ) -> None:
        reason = sshd_unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        import getpass

        self.user = user or getpass.getuser()
        self.pci = pci or [list(GCE_VM_PCI) for _ in range(n)]
        self.ports = dict(ports or {})
        if len(self.pci) != n:
            raise ValueError(f"pci lists {len(self.pci)} hosts' devices for {n} hosts")
        self.use_netns = netns_available() if netns is None else netns
        if self.use_netns and not netns_available():
            raise RuntimeError("network namespaces are not available (needs root and iproute2)")
        if self.ports and not self.use_netns:
            raise ValueError("ports (each host's own sshd port) need network namespaces")
        self.client_key = self.workdir / "client_ed25519"
        _run(
            [
                SSH_KEYGEN,
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-f",
                str(self.client_key),
                "-C",
                "aios-test-client",
            ]
        )
        self.authorized_keys = self.workdir / "authorized_keys"
        self.authorized_keys.write_text(self.client_key.with_suffix(".pub").read_text())
        self.tag = f"{os.getpid() % 10000:04d}{random.randint(0, 99):02d}"
        self.switch_ns: str | None = None
        self.root_if: str | None = None
        self.subnet: str | None = None
        self.hosts: list[SshdHost] = []
        self.services: list[subprocess.Popen] = []
        try:
            if self.use_netns:
                self._network(n)
            self._hosts(n)
            if forwarded:
                self._forward()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ network
    def _pick_subnet(self) -> int:
        routes = _run([IP, "-4", "route", "show"]).stdout + _run([IP, "-4", "addr", "show"]).stdout
        candidates = list(range(0, 256))
        random.shuffle(candidates)
        for third in candidates:
            if f"10.213.{third}." not in routes:
                return third
        raise RuntimeError("no free 10.213.x.0/24 test subnet")

    def _network(self, n: int) -> None:
        _LOCK.touch(exist_ok=True)
        with open(_LOCK) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            third = self._pick_subnet()
            self.subnet = f"10.213.{third}"
            sw = f"aios-sw-{self.tag}"
            _run([IP, "netns", "add", sw])
            self.switch_ns = sw
            _run([IP, "-n", sw, "link", "add", "br0", "type", "bridge"])
            _run([IP, "-n", sw, "link", "set", "br0", "up"])
            _run([IP, "-n", sw, "link", "set", "lo", "up"])
            # this machine's leg: aiosR<tag> (root) <-> up0 (switch)
            self.root_if = f"aiosR{self.tag}"
            _run(
                [
                    IP,
                    "link",
                    "add",
                    self.root_if,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "up0",
                    "netns",
                    sw,
                ]
            )
            _run([IP, "addr", "add", f"{self.subnet}.1/24", "dev", self.root_if])
            _run([IP, "link", "set", self.root_if, "up"])
            _run([IP, "-n", sw, "addr", "add", f"{self.subnet}.2/24", "dev", "br0"])
            _run([IP, "-n", sw, "link", "set", "up0", "master", "br0"])
            _run([IP, "-n", sw, "link", "set", "up0", "up"])
        for i in range(n):
            ns = f"aios-h{i}-{self.tag}"
            _run([IP, "netns", "add", ns])
            port = f"p{i}"
            _run(
                [
                    IP,
                    "-n",
                    sw,
                    "link",
                    "add",
                    port,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth0",
                    "netns",
                    ns,
                ]
            )
            _run([IP, "-n", sw, "link", "set", port, "master", "br0"])
            _run([IP, "-n", sw, "link", "set", port, "up"])
            _run([IP, "-n", ns, "addr", "add", f"{self.subnet}.{10 + i}/24", "dev", "eth0"])
            _run([IP, "-n", ns, "link", "set", "eth0", "up"])
            _run([IP, "-n", ns, "link", "set", "lo", "up"])
            _run([IP, "-n", ns, "route", "add", "default", "via", f"{self.subnet}.1"])
            etc = NETNS_ETC / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(
                "127.0.0.1 localhost\n::1 localhost\n"
                + "".join(f"{self.subnet}.{10 + j} aios-{self.tag}-w{j}\n" for j in range(n))
            )
            # no DNS server is reachable from the namespace: fail lookups at once instead of
            # timing out (torch's c10d store reverse-resolves every client)
            (etc / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")

    def _hosts(self, n: int) -> None:
        for i in range(n):
            name = f"host{i}-{self.tag}"
            d = self.workdir / f"host{i}"
            (d / "etc").mkdir(parents=True, exist_ok=True)
            (d / "home").mkdir(parents=True, exist_ok=True)
            if self.use_netns:
                ip = f"{self.subnet}.{10 + i}"
                host = SshdHost(
                    name,
                    i,
                    ip,
                    self.ports.get(i, 22),
                    d / "home",
                    d / "etc",
                    self.authorized_keys,
                    netns=f"aios-h{i}-{self.tag}",
                    internal_ip=ip,
                    hostname=f"aios-{self.tag}-w{i}",
                    pci=list(self.pci[i]),
                )
            else:
                host = SshdHost(
                    name,
                    i,
                    "127.0.0.1",
                    _free_port(),
                    d / "home",
                    d / "etc",
                    self.authorized_keys,
                    internal_ip="127.0.0.1",
                )
            self.hosts.append(host)
            host.start()

    FORWARD_BASE = 2201

    def _forward(self) -> None:
        """Forwarded-port mode: the hosts sit behind one gateway (the switch namespace's
        address) that forwards ``FORWARD_BASE + i`` to host ``i``'s sshd on 22, as a NAT
        router's port forwards do; this machine reaches host ``i`` only at
        ``service_ip:FORWARD_BASE+i``, while the hosts reach each other on 22."""
        if not self.use_netns:
            raise RuntimeError("forwarded-port mode needs network namespaces")
        import sys

        rules = [f"{self.FORWARD_BASE + h.worker_id}:{h.internal_ip}:{h.port}" for h in self.hosts]
        self.popen_service(
            [sys.executable, "-m", "aios_cloud.testing.portfwd", self.service_ip, *rules],
            env={**os.environ},
        )
        for h in self.hosts:
            self.wait_port(self.FORWARD_BASE + h.worker_id)
            h.sshd_ip, h.sshd_port = h.ip, h.port
            h.ip, h.port = self.service_ip, self.FORWARD_BASE + h.worker_id

    # ------------------------------------------------------------------ services
    @property
    def service_ip(self) -> str:
        """Address of :meth:`popen_service` servers, reachable from this machine and every host."""
        return f"{self.subnet}.2" if self.use_netns else "127.0.0.1"

    def popen_service(self, argv: list[str], **kw: Any) -> subprocess.Popen:
        """Start a server (bind it to :attr:`service_ip`) where the hosts and this machine both
        reach it: in the switch namespace, or on loopback. Stopped by :meth:`close`."""
        if self.use_netns:
            argv = [IP, "netns", "exec", str(self.switch_ns), *argv]
        kw.setdefault("stdout", subprocess.DEVNULL)
        kw.setdefault("stderr", subprocess.DEVNULL)
        p = subprocess.Popen(argv, start_new_session=True, **kw)
        self.services.append(p)
        return p

    def wait_port(self, port: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((self.service_ip, port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"nothing listens on {self.service_ip}:{port}")

    # ------------------------------------------------------------------ client
    def ssh_argv(self, host: SshdHost, known_hosts: str | None = None) -> list[str]:
        """``ssh`` argv (without the remote command) that logs into ``host``."""
        kh = (
            ["-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes"]
            if known_hosts
            else ["-o", "UserKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=no"]
        )
        return [
            "ssh",
            "-i",
            str(self.client_key),
            "-p",
            str(host.port),
            "-o",
            "BatchMode=yes",
            "-o",
            "LogLevel=ERROR",
            *kh,
            f"{self.user}@{host.ip}",
        ]

    def close(self) -> None:
        for p in getattr(self, "services", []):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                p.wait(timeout=10)
        self.services = []
        for h in self.hosts:
            with contextlib.suppress(Exception):
                h.stop()
        if self.use_netns:
            for i in range(len(self.hosts) or 64):
                ns = f"aios-h{i}-{self.tag}"
                if _run([IP, "netns", "pids", ns], check=False).returncode != 0:
                    if not self.hosts:
                        break
                    continue
                _run([IP, "netns", "del", ns], check=False)
                shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
            if self.root_if:
                _run([IP, "link", "del", self.root_if], check=False)
            if self.switch_ns:
                _run([IP, "netns", "del", self.switch_ns], check=False)
        self.hosts = []

    def __enter__(self) -> SshdCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["GCE_VM_PCI", "SshdCluster", "SshdHost", "netns_available", "sshd_unavailable_reason"]
