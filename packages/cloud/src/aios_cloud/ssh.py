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
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from aios.errors import AiosError

from aios_cloud.provider import ClusterHost

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
    """

    def __init__(
        self,
        hosts: Sequence[ClusterHost],
        known_hosts: str | os.PathLike[str],
        key: str | None = None,
        alias: str = "aios",
        retries: int = 5,
        backoff: float = 1.0,
        connect_timeout: int = 10,
        printer: Callable[[str, str], None] | None = None,
        rng: random.Random | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.hosts = list(hosts)
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
        argv += [
            "-p",
            str(host.port),
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
            f"{host.ssh_user}@{host.ip}",
        ]
        return argv

    def argv(self, host: ClusterHost, command: str, tty: bool = False) -> list[str]:
        return [*self.base_argv(host, tty=tty), command]

    def reset_host_keys(self) -> None:
        """Forget pinned host keys (after aios stopped/started or recreated the hosts)."""
        self.known_hosts.unlink(missing_ok=True)

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
                proc = subprocess.Popen(
                    self.argv(host, command),
                    stdin=stdin,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    errors="replace",
                    bufsize=1,
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
            try:
                res.returncode = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                res.returncode = 124
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
        with ThreadPoolExecutor(max_workers=min(64, len(hosts))) as pool:
            futs = [
                pool.submit(
                    self.run_one,
                    h,
                    command(h) if callable(command) else command,
                    stdin_path,
                    timeout,
                    stream,
                )
                for h in hosts
            ]
            return [f.result() for f in futs]

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

    def wait_reachable(self, timeout: float = 300.0) -> None:
        """Wait until every host accepts SSH (fresh VMs take a while)."""
        deadline = time.monotonic() + timeout
        pending = list(self.hosts)
        delay = 1.0
        while pending:
            results = self.run(
                "true", stream=False, hosts=pending, timeout=self.connect_timeout + 5
            )
            pending = [r.host for r in results if not r.ok]
            if not pending:
                return
            if time.monotonic() > deadline:
                r = [x for x in results if not x.ok][0]
                raise SshError(
                    f"{r.host.label} is not reachable over SSH after {timeout:.0f}s "
                    f"({_first_line(chr(10).join(r.stderr))})",
                    "check the firewall allows port 22, then `aios start NAME`",
                )
            self.sleep(delay)
            delay = min(delay * 2, 10)


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:200]
    return ""


def _is_ssh_noise(line: str) -> bool:
    return line.startswith("Warning: Permanently added")


def ensure_client_key(path: str | os.PathLike[str] | None = None) -> Path:
    """aios's own SSH key (``$AIOS_HOME/keys/aios_ed25519``), created on first use."""
    from aios_cloud.store import aios_home

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
