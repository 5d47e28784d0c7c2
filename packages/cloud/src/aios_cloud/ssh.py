"""Run commands on every host of a cluster in parallel over OpenSSH.

* Output is streamed line by line, each line prefixed ``(worker N, ip)``.
* The transient failures cloud VMs show right after boot or under load (``ssh`` exit status 255
  with a connection error and no output from the remote command: "Connection refused",
  "kex_exchange_identification", "Connection reset", "Connection timed out") are retried with
  exponential backoff and jitter. A remote command that itself printed output and then exited
  255 is *not* re-run (it may not be idempotent), and a changed host key is never retried.
* Host keys are pinned per cluster in an aios-managed known_hosts file
  (``$AIOS_HOME/clusters/NAME/known_hosts``) under a per-worker alias: the first connection after
  (re)provisioning records the key (``accept-new``); :meth:`SshRunner.reset_host_keys` forgets
  them when aios itself stopped/started or recreated the machines (their keys change then).
  The user's ``~/.ssh/known_hosts`` is never touched.
* Bounded and timed: at most ``max_parallel`` ssh processes at once (a small worker pool, never a
  thread per host), every command has a timeout (``command_timeout`` unless the caller gives
  one), and every ssh runs as a subprocess registered in this module, so :func:`kill_all` (the
  launcher calls it on SIGINT/SIGTERM) ends them at once and no stuck thread blocks exit.
* Connection reuse (``control=True``): OpenSSH ``ControlMaster``/``ControlPersist`` sockets in a
  per-process control directory (:func:`control_dir`); :func:`close_masters` ends the masters
  (registered with ``atexit``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from aios.errors import AiosError

from aios_cloud.fleet import connection_failure
from aios_cloud.provider.data import ClusterHost
from aios_cloud.store import aios_home

Command = str | Callable[[ClusterHost], str]

TRANSIENT_PATTERNS = re.compile(
    r"connection refused|connection reset|connection timed out|operation timed out|"
    r"kex_exchange_identification|ssh_exchange_identification|connection closed by|"
    r"no route to host|network is unreachable|broken pipe|temporary failure in name resolution|"
    r"could not resolve hostname|connection to .* closed",
    re.IGNORECASE,
)
HOSTKEY_CHANGED = re.compile(
    r"REMOTE HOST IDENTIFICATION HAS CHANGED|Host key verification failed", re.IGNORECASE
)


MAX_PARALLEL = 8  # ssh processes this machine runs at once, whatever the number of hosts
SSH_RETRIES = 5  # extra attempts after a transient exit-255 failure (exponential back-off)
COMMAND_TIMEOUT = 600.0  # seconds a remote command may take unless the caller says otherwise
PROGRESS_EVERY = 10.0  # seconds between "waiting for ..." lines

_LIVE: set[subprocess.Popen] = set()
_LIVE_LOCK = threading.Lock()
_CONTROL: dict[str, Any] = {}
#: an agent of :func:`agent_env`: its process (None when none could hold the key) and the
#: environment ssh uses to reach it ({} then)
_Agent = tuple["subprocess.Popen[bytes] | None", dict[str, str]]


def _spawn(argv: list[str], **kw: Any) -> subprocess.Popen:
    """Start a subprocess that :func:`kill_all` can end (its own process group)."""
    p = subprocess.Popen(argv, start_new_session=True, **kw)
    with _LIVE_LOCK:
        _LIVE.add(p)
    return p


def _reap(p: subprocess.Popen) -> None:
    with _LIVE_LOCK:
        _LIVE.discard(p)


def _kill(p: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        p.kill()


def kill_all() -> int:
    """Kill every ssh (and helper) process this process started and has not reaped; returns
    how many. Called on SIGINT/SIGTERM so that no thread waits on a stuck remote command."""
    with _LIVE_LOCK:
        procs = list(_LIVE)
    for p in procs:
        if p.poll() is None:
            _kill(p)
    return len(procs)


def live_count() -> int:
    """ssh processes of this process still running (for tests and the bench)."""
    with _LIVE_LOCK:
        return sum(1 for p in _LIVE if p.poll() is None)


def control_dir() -> Path:
    """This process's ControlMaster directory (short, under /tmp: socket paths are limited to
    about 100 bytes), created on first use and removed by :func:`close_masters`."""
    d = _CONTROL.get("dir")
    if d is None:
        import tempfile

        d = Path(tempfile.mkdtemp(prefix="aios-cm-", dir="/tmp"))
        _CONTROL["dir"] = d
        atexit.register(close_masters)
    return d


def close_masters() -> None:
    """End the ControlMaster connections (and the ssh-agents) this process opened."""
    d = _CONTROL.pop("dir", None)
    agents: dict[str, _Agent] = _CONTROL.pop("agents", {})
    for agent, _env in agents.values():
        if agent is not None:
            _kill(agent)
            _reap(agent)
    if d is None:
        return
    for sock in Path(d).glob("cm-*"):
        with contextlib.suppress(Exception):
            subprocess.run(
                ["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "aios-control"],
                capture_output=True,
                timeout=5,
            )
    shutil.rmtree(d, ignore_errors=True)


#: how long a new ssh-agent may take to listen on its socket (a loaded machine)
AGENT_START_S = 30.0


def _listening(sock: Path) -> bool:
    """Whether a process accepts connections on the unix socket ``sock``."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(sock))
        except OSError:
            return False
    return True


def agent_env(key: str | None) -> dict[str, str]:
    """An ``ssh-agent`` of this process holding ``key`` and nothing else (started once per key):
    what the head host uses, through agent forwarding, to reach the other hosts the first time
    (the private key never leaves this machine). One agent per key: a forwarded agent offers
    every key it holds in turn, and sshd refuses a login after ``MaxAuthTries`` (6) wrong ones,
    so a process that had reached six other clusters (a long-lived watcher, a test session)
    could no longer reach a seventh. Returns the environment for ssh; ``{}`` when no agent can
    run."""
    if not key:
        return {}
    path = str(Path(key).expanduser())
    agents: dict[str, _Agent] = _CONTROL.setdefault("agents", {})
    if path in agents:
        return dict(agents[path][1])
    sock = control_dir() / f"agent-{len(agents)}.sock"
    try:
        p = subprocess.Popen(
            ["ssh-agent", "-D", "-a", str(sock)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:
        agents[path] = (None, {})
        return {}
    # listening, not merely there: ssh-agent binds its socket (the file appears) before it
    # listens, and an ssh-add between the two is refused ("Could not open a connection")
    deadline = time.monotonic() + AGENT_START_S
    up = _listening(sock)
    while not up and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.02)
        up = _listening(sock)
    env = {"SSH_AUTH_SOCK": str(sock)} if up else {}
    if env:
        r = subprocess.run(
            ["ssh-add", "-q", path], env={**os.environ, **env}, capture_output=True, timeout=30
        )
        if r.returncode == 0:
            agents[path] = (p, env)
            return dict(env)
    _kill(p)  # no agent holding the key: ssh goes without forwarding (the head says so)
    _reap(p)
    agents[path] = (None, {})
    return {}


class SshError(AiosError):
    """SSH to a host failed for good (key missing, host key changed, retries exhausted)."""


class HostKeyChanged(SshError):
    """The host at a pinned address presents a different host key: the machine was replaced
    (or someone is in the middle). ``host`` is the :class:`ClusterHost` concerned."""

    def __init__(self, message: str, fix: str = "", host: ClusterHost | None = None) -> None:
        super().__init__(message, fix)
        self.host = host


@dataclass
class HostResult:
    host: ClusterHost
    returncode: int
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    attempts: int = 1

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class LinePrinter:
    """Thread-safe prefixed line writer."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stdout
        self.lock = threading.Lock()

    def __call__(self, prefix: str, line: str) -> None:
        with self.lock:
            self.stream.write(f"{prefix} {line}\n" if prefix else f"{line}\n")
            self.stream.flush()


class SshRunner:
    """Parallel SSH to ``hosts``.

    :param known_hosts: the cluster's pinned known_hosts file.
    :param key: private key path (``None``: ssh's defaults/agent).
    :param alias: host-key alias prefix (``aios-NAME``); each worker is pinned as ``alias-wN``.
    :param retries: extra attempts after a transient exit-255 failure.
    :param backoff: first backoff in seconds (doubles each attempt, with jitter).
    :param printer: where prefixed output lines go (``None``: not streamed, only collected).
    :param max_parallel: ssh processes at once (a bounded pool, never a thread per host).
    :param command_timeout: default limit for one remote command (``None``: none).
    :param control: reuse one connection per host (OpenSSH ControlMaster/ControlPersist).
    :param forward_agent: forward this process's ssh-agent (holding ``key``): the head host
        reaches the other hosts with it the first time.
    :param log: progress lines while waiting ("reachable 3/4, waiting for worker 2 (...)").
    """

    def __init__(
        self,
        hosts: Sequence[ClusterHost],
        known_hosts: str | os.PathLike[str],
        key: str | None = None,
        alias: str = "aios",
        retries: int = SSH_RETRIES,
        backoff: float = 1.0,
        connect_timeout: int = 10,
        printer: Callable[[str, str], None] | None = None,
        rng: random.Random | None = None,
        sleep: Callable[[float], None] = time.sleep,
        max_parallel: int = MAX_PARALLEL,
        command_timeout: float | None = COMMAND_TIMEOUT,
        control: bool = False,
        forward_agent: bool = False,
        log: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.hosts = list(hosts)
        self.max_parallel = max(1, max_parallel)
        self.command_timeout = command_timeout
        self.control = control
        self.forward_agent = forward_agent
        self.log = log
        self.clock = clock
        self.known_hosts = Path(known_hosts)
        self.key = key
        self.alias = alias
        self.retries = retries
        self.backoff = backoff
        self.connect_timeout = connect_timeout
        self.printer = printer
        self.rng = rng or random.Random()
        self.sleep = sleep
        if key and not Path(key).expanduser().is_file():
            raise SshError(
                f"SSH key {key} does not exist",
                "pass an existing private key with --ssh-key, or omit it to let aios create one",
            )

    # ------------------------------------------------------------------ argv
    def base_argv(self, host: ClusterHost, tty: bool = False) -> list[str]:
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        argv = ["ssh"]
        if tty:
            argv.append("-t")
        key = host.ssh_key or self.key
        if key:
            argv += ["-i", str(Path(key).expanduser()), "-o", "IdentitiesOnly=yes"]
        if host.port:  # 0: not given, ssh_config decides (ssh_config(5): the command line wins)
            argv += ["-p", str(host.port)]
        argv += [
            "-o",
            "BatchMode=yes",
            "-o",
            f"ConnectTimeout={self.connect_timeout}",
            "-o",
            "ServerAliveInterval=15",
            "-o",
            "ServerAliveCountMax=4",
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=accept-new",
            "-o",
            "HashKnownHosts=no",
            "-o",
            f"HostKeyAlias={self.alias}-w{host.worker_id}",
            "-o",
            "LogLevel=ERROR",
        ]
        if self.control:
            argv += [
                "-o",
                "ControlMaster=auto",
                "-o",
                f"ControlPath={control_dir()}/cm-%C",
                "-o",
                "ControlPersist=120",
            ]
        if self.forward_agent:
            argv += ["-o", "ForwardAgent=yes"]
        argv.append(f"{host.ssh_user}@{host.ip}" if host.ssh_user else host.ip)
        return argv

    def _env(self) -> dict[str, str] | None:
        if not self.forward_agent:
            return None
        return {**os.environ, **agent_env(self.key)}

    def argv(self, host: ClusterHost, command: str, tty: bool = False) -> list[str]:
        return [*self.base_argv(host, tty=tty), command]

    def reset_host_keys(self) -> None:
        """Forget pinned host keys (after aios stopped/started or recreated the hosts); the
        head host forgets the keys it pinned for the other hosts at its next reach
        (:attr:`reset_marker`)."""
        self.known_hosts.unlink(missing_ok=True)
        if self.known_hosts.parent.is_dir():
            self.reset_marker.touch()

    @property
    def reset_marker(self) -> Path:
        return self.known_hosts.with_name(self.known_hosts.name + ".reset")

    # ------------------------------------------------------------------ running
    def run_one(
        self,
        host: ClusterHost,
        command: str,
        stdin_path: str | None = None,
        timeout: float | None = None,
        stream: bool = True,
    ) -> HostResult:
        prefix = f"({host.label})"
        attempt = 0
        while True:
            attempt += 1
            res = HostResult(host, -1, attempts=attempt)
            stdin = open(stdin_path, "rb") if stdin_path else subprocess.DEVNULL
            try:
                proc = _spawn(
                    self.argv(host, command),
                    stdin=stdin,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    errors="replace",
                    bufsize=1,
                    env=self._env(),
                )
            finally:
                if stdin_path:
                    stdin.close()  # type: ignore[union-attr]

            def pump(src: IO[str], sink: list[str], is_err: bool) -> None:
                for line in src:
                    line = line.rstrip("\n")
                    sink.append(line)
                    if stream and self.printer and not (is_err and _is_ssh_noise(line)):
                        self.printer(prefix, line)

            t_out = threading.Thread(
                target=pump, args=(proc.stdout, res.stdout, False), daemon=True
            )
            t_err = threading.Thread(target=pump, args=(proc.stderr, res.stderr, True), daemon=True)
            t_out.start()
            t_err.start()
            limit = timeout if timeout is not None else self.command_timeout
            try:
                res.returncode = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                _kill(proc)
                proc.wait()
                res.returncode = 124
                res.stderr.append(f"[aios] timed out after {limit:.0f}s")
            except BaseException:  # interrupted (SIGINT/SIGTERM): never leave the ssh behind
                _kill(proc)
                raise
            finally:
                _reap(proc)
            t_out.join(5)
            t_err.join(5)
            if res.returncode != 255:
                return res
            err = "\n".join(res.stderr)
            if HOSTKEY_CHANGED.search(err):
                raise HostKeyChanged(
                    f"host key of {host.label} changed unexpectedly (pinned in {self.known_hosts})",
                    "if aios did not recreate it, investigate; otherwise run `aios start "
                    "NAME` or delete that known_hosts file",
                    host=host,
                )
            if "Permission denied" in err:
                raise SshError(
                    f"SSH login to {host.label} as {host.ssh_user} was refused (publickey)",
                    "check --ssh-key / --ssh-user, or relaunch so aios installs its key",
                )
            transient = not res.stdout and (
                TRANSIENT_PATTERNS.search(err) is not None or not err.strip()
            )
            if not transient or attempt > self.retries:
                return res
            delay = self.backoff * (2 ** (attempt - 1)) * (0.5 + self.rng.random())
            if self.printer and stream:
                self.printer(
                    prefix,
                    f"[aios] ssh exit 255 ({_first_line(err)}); retry {attempt}/{self.retries} in {delay:.1f}s",
                )
            self.sleep(delay)

    def run(
        self,
        command: Command,
        stdin_path: str | None = None,
        timeout: float | None = None,
        stream: bool = True,
        hosts: Sequence[ClusterHost] | None = None,
    ) -> list[HostResult]:
        """Run on every host at once; ``command`` is a string or ``command(host) -> str``.
        Results come back in worker order."""
        hosts = list(hosts or self.hosts)
        if not hosts:
            return []
        return self._pool(
            hosts,
            lambda h: self.run_one(
                h, command(h) if callable(command) else command, stdin_path, timeout, stream
            ),
        )

    def _pool(
        self, hosts: list[ClusterHost], fn: Callable[[ClusterHost], Any], what: str = "done"
    ) -> list[Any]:
        """``fn(host)`` for every host on at most ``max_parallel`` threads; a progress line every
        :data:`PROGRESS_EVERY` seconds names the hosts still being waited for. On an interrupt
        every ssh is killed and the pool is not waited for."""
        pool = ThreadPoolExecutor(max_workers=min(self.max_parallel, len(hosts)))
        started: dict[Any, tuple[ClusterHost, float]] = {}
        try:
            futs = {}
            for h in hosts:
                f = pool.submit(self._timed, started, h, fn)
                futs[f] = h
            pending = set(futs)
            last = self.clock()
            while pending:
                _done, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
                if pending and self.log and self.clock() - last >= PROGRESS_EVERY:
                    last = self.clock()
                    self.log(
                        self.progress_line(len(hosts), len(hosts) - len(pending), started, what)
                    )
            results = [f.result() for f in futs]
        except (KeyboardInterrupt, SystemExit):
            kill_all()  # a signal: end every ssh now, wait for no thread
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        return results

    def _timed(
        self,
        started: dict[Any, tuple[ClusterHost, float]],
        h: ClusterHost,
        fn: Callable[[ClusterHost], Any],
    ) -> Any:
        key = object()
        started[key] = (h, self.clock())
        try:
            return fn(h)
        finally:
            started.pop(key, None)

    def progress_line(
        self, total: int, done: int, started: dict[Any, tuple[ClusterHost, float]], what: str
    ) -> str:
        waiting = sorted(started.values(), key=lambda x: x[1])
        if not waiting:
            return f"{what} {done}/{total}"
        h, t0 = waiting[0]
        return (
            f"{what} {done}/{total}, waiting for worker {h.worker_id} ({_ago(self.clock() - t0)})"
        )

    def check(self, results: list[HostResult], what: str) -> None:
        bad = [r for r in results if not r.ok]
        if bad:
            r = bad[0]
            detail = (
                _first_line("\n".join(r.stderr[-3:] or r.stdout[-3:]))
                or f"exit status {r.returncode}"
            )
            raise SshError(
                f"{what} failed on {len(bad)} of {len(results)} hosts ({r.host.label}: {detail})",
                "see the output above; rerun with --debug",
            )

    def wait_reachable(
        self, timeout: float = 300.0, hosts: Sequence[ClusterHost] | None = None
    ) -> None:
        """Wait until every host accepts SSH (fresh VMs take a while), printing progress
        ("reachable 3/4, waiting for worker 2 (connection refused, 1m10s)"); after ``timeout``
        seconds the hosts still missing are named with their state."""
        start = self.clock()
        deadline = start + timeout
        pending = list(hosts or self.hosts)
        total = len(pending)
        state: dict[int, str] = {}
        delay = 1.0
        last = start
        while pending:
            left = max(1.0, deadline - self.clock())
            results = self.run(
                "true",
                stream=False,
                hosts=pending,
                timeout=min(self.connect_timeout + 5, left + 1),
            )
            for r in results:
                if not r.ok:
                    state[r.host.worker_id] = _state_of(r)
            pending = [r.host for r in results if not r.ok]
            if not pending:
                return
            now = self.clock()
            if now >= deadline:
                names = ", ".join(
                    f"worker {h.worker_id} ({state[h.worker_id]})" for h in pending[:5]
                )
                more = f" and {len(pending) - 5} more" if len(pending) > 5 else ""
                raise SshError(
                    f"{len(pending)} of {total} hosts not reachable over SSH after "
                    f"{timeout:.0f}s: {names}{more}",
                    "check that those hosts are up and the firewall allows SSH",
                )
            if self.log and now - last >= PROGRESS_EVERY:
                last = now
                h = pending[0]
                self.log(
                    f"reachable {total - len(pending)}/{total}, waiting for worker "
                    f"{h.worker_id} ({state[h.worker_id]}, {_ago(now - start)})"
                )
            self.sleep(min(delay, max(0.0, deadline - now)))
            delay = min(delay * 2, 10)


def _ago(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _state_of(r: HostResult) -> str:
    """A failed host's state in a few words, for progress lines and errors."""
    if r.returncode == 124:
        return "no answer (stalled)"

    line = _first_line("\n".join(r.stderr)).lower()
    return connection_failure(line) or line[:80] or f"exit status {r.returncode}"


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:200]
    return ""


def _is_ssh_noise(line: str) -> bool:
    return line.startswith("Warning: Permanently added")


def ensure_client_key(path: str | os.PathLike[str] | None = None) -> Path:
    """aios's own SSH key (``$AIOS_HOME/keys/aios_ed25519``), created on first use."""

    p = Path(path) if path else aios_home() / "keys" / "aios_ed25519"
    if p.exists():
        return p
    p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    r = subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "aios", "-f", str(p)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise SshError(
            f"could not create an SSH key at {p}: {r.stderr.strip()}",
            "install openssh-client, or pass --ssh-key",
        )
    return p
