"""The head fan-out: worker 0 drives every other host of the cluster (``fleet.py`` there), so a
launch opens one SSH connection however many hosts there are."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shlex
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aios_cloud import fleet
from aios_cloud.provider.data import ClusterHost
from aios_cloud.records import Log, cluster_key, record_hosts, remote_root, runner_for
from aios_cloud.ssh import (
    SSH_RETRIES,
    HostResult,
    SshError,
    _first_line,
    _state_of,
)
from aios_cloud.store import (
    ClusterRecord,
)

HELPER_PYTHON = "python3"  # the hosts' system python runs fleet.py (before aios is there)


FAN_PARALLEL = 32  # hosts the head host drives at once


def _seconds(env: str, default: float) -> float:
    try:
        return float(os.environ.get(env, "") or default)
    except ValueError:
        return default


def reach_timeout() -> float:
    """How long a launch waits for every host to accept SSH (``AIOS_REACH_TIMEOUT``, 300 s)."""
    return _seconds("AIOS_REACH_TIMEOUT", 300.0)


def command_timeout() -> float:
    """Limit for one remote step on one host: code sync, job start, cancel
    (``AIOS_COMMAND_TIMEOUT``, 600 s)."""
    return _seconds("AIOS_COMMAND_TIMEOUT", 600.0)


def setup_timeout() -> float:
    """Limit for the setup script on one host (``AIOS_SETUP_TIMEOUT``, 3600 s)."""
    return _seconds("AIOS_SETUP_TIMEOUT", 3600.0)


class Head:
    """The launcher's one place to talk to: worker 0 of the cluster, over one reused SSH
    connection (ControlMaster) with this machine's agent forwarded. It runs
    :mod:`aios_cloud.fleet` there, which drives every other host over the cluster network
    (bounded pool, a timeout per host, progress lines), so what this machine sends and the
    connections it holds do not grow with the number of hosts."""

    def __init__(
        self,
        rec: ClusterRecord,
        printer: Callable[[str, str], None] | None = None,
        log: Log | None = None,
        retries: int = SSH_RETRIES,
    ) -> None:
        """``retries``: extra SSH attempts after a transient failure (with back-off)."""
        self.rec = rec
        self.hosts = record_hosts(rec)
        if not self.hosts:
            raise SshError(f"cluster {rec.name} has no hosts recorded", "see `aios status`")
        self.head = self.hosts[0]
        self.labels = {h.worker_id: h.label for h in self.hosts}
        self.printer = printer
        self.log = log or (lambda m: None)
        self.root = remote_root(rec.name)
        self.helper: str | None = None
        own = cluster_key(rec.name)
        self.own_key = (
            own if rec.ssh_key and Path(rec.ssh_key).expanduser() == own and own.is_file() else None
        )
        self.runner = runner_for(
            rec,
            None,
            control=True,
            forward_agent=self.own_key is None,
            log=self.log,
            retries=retries,
        )
        self.sent = 0  # payload bytes this machine sent to the head
        self.reset_keys = False  # set by reach(): the hosts were recreated, keys re-pinned

    # -------------------------------------------------------------- plumbing
    def _call(
        self, cmd: str, payload: bytes, timeout: float, echo: bool = True
    ) -> tuple[HostResult, dict[int, tuple[int, str]], dict[int, list[str]], list[str]]:
        """Run ``cmd`` on the head with ``payload`` on stdin; returns the ssh result, the
        ``R`` lines (worker -> (rc, state)), the ``O`` lines per worker and other lines."""
        results: dict[int, tuple[int, str]] = {}
        outputs: dict[int, list[str]] = {}
        other: list[str] = []
        head_prefix = f"({self.head.label})"

        def parse(_prefix: str, line: str) -> None:
            tag, _, rest = line.partition(" ")
            if tag == "O":
                w, _, text = rest.partition(" ")
                if w.isdigit():
                    outputs.setdefault(int(w), []).append(text)
                    if echo and self.printer:
                        self.printer(f"({self.labels.get(int(w), 'worker ' + w)})", text)
                    return
            elif tag == "P":
                self.log(rest)
                return
            elif tag == "R":
                parts = rest.split(" ", 2)
                if len(parts) == 3 and parts[0].isdigit():
                    results[int(parts[0])] = (int(parts[1]), parts[2])
                    return
            other.append(line)
            if echo and self.printer and tag not in ("M", "OK", "NEED_HOSTS"):
                self.printer(head_prefix, line)

        self.runner.printer = parse
        fd, path = tempfile.mkstemp(prefix="aios-head-")
        try:
            with os.fdopen(fd, "wb") as f:  # mode 600: env files may hold forwarded secrets
                f.write(payload)
            self.sent += len(payload)
            # the head ends the command itself at the same limit: nothing stays behind there
            wrapped = f"timeout -k 5 {int(timeout) + 1} bash -c {shlex.quote(cmd)}"
            r = self.runner.run_one(self.head, wrapped, stdin_path=path, timeout=timeout)
        finally:
            os.unlink(path)
            self.runner.printer = None
        return r, results, outputs, other

    def _head_failed(self, r: HostResult, what: str) -> SshError:
        detail = _first_line("\n".join(r.stderr[-5:])) or _state_of(r)
        return SshError(
            f"{what} failed on {self.head.label} (the head host: {detail})",
            "see the output above; rerun with --debug",
        )

    def ensure_helper(self) -> str:
        """Ship fleet.py to the head when its copy differs (a few KiB, once)."""
        if self.helper:
            return self.helper

        src = Path(fleet.__file__).read_bytes()
        sha = hashlib.sha256(src).hexdigest()[:16]
        path = f"{self.root}/fleet/fleet-{sha}.py"
        r = self.runner.run_one(
            self.head,
            f"test -f {path} && echo have || echo need; "
            f"test -f {self.root}/fleet/id_ed25519 && echo key || true",
            stream=False,
            timeout=60,
        )
        if not r.ok:
            raise self._head_failed(r, "reaching the head host")
        if self.own_key and "key" not in r.stdout:
            # the cluster's own key (authorized on these hosts only): the head reaches the
            # others with it, no agent round trip through this machine per host
            pub = Path(str(self.own_key) + ".pub").read_text().strip()
            cmd = (
                f"set -e; mkdir -p {self.root}/fleet; umask 077; "
                f"cat > {self.root}/fleet/id_ed25519.tmp; "
                f"mv {self.root}/fleet/id_ed25519.tmp {self.root}/fleet/id_ed25519; "
                f"echo {shlex.quote(pub)} > {self.root}/fleet/id_ed25519.pub"
            )
            r2, *_ = self._call(cmd, Path(self.own_key).read_bytes(), timeout=60)
            if not r2.ok:
                raise self._head_failed(r2, "installing the cluster key")
        if "have" not in r.stdout:
            cmd = (
                f"set -e; mkdir -p {self.root}/fleet; rm -f {self.root}/fleet/fleet-*.py; "
                f"gzip -dc > {path}.tmp; mv {path}.tmp {path}"
            )
            r, *_ = self._call(cmd, gzip.compress(src, 9), timeout=120)
            if not r.ok:
                raise self._head_failed(r, "installing aios's helper")
        self.helper = path
        return path

    def _hosts_json(self, hosts: list[ClusterHost] | None = None) -> list[dict[str, Any]]:
        return [
            {
                "w": h.worker_id,
                "ip": h.internal_ip or h.ip,
                # the host's own sshd port on the shared network (behind NAT or a port forward
                # the port the user reaches it at is the gateway's, not the host's)
                "port": h.internal_port if h.internal_port is not None else (h.port or 22),
                "user": h.ssh_user,
            }
            for h in (hosts or self.hosts)
        ]

    def fan(
        self,
        what: str,
        cmd: str | None = None,
        tasks: dict[int, tuple[str, str]] | None = None,
        timeout: float | None = None,
        retry_until: float = 0.0,
        install_key: bool = False,
        echo: bool = True,
        hosts: list[ClusterHost] | None = None,
        sub: str = "fan",
        send_hosts: bool = False,
    ) -> tuple[dict[int, tuple[int, str]], dict[int, list[str]]]:
        """Run ``cmd`` (or per-worker ``tasks``: worker -> (command, stdin text)) on every host
        through the head. Returns worker -> (exit code, state) and each worker's output lines.
        Raises :class:`SshError` when the head itself cannot be used."""
        helper = self.ensure_helper()
        hosts = hosts or self.hosts
        limit = command_timeout() if timeout is None else timeout
        every = self._hosts_json()
        ref = hashlib.sha256(json.dumps(every).encode()).hexdigest()[:16]
        req: dict[str, Any] = {
            "hosts_ref": ref,  # the head keeps the host list: polls do not resend it
            "self": self.head.worker_id,
            "what": what,
            "timeout": limit,
            "parallel": FAN_PARALLEL,
            "retry_until": retry_until,
            "install_key": install_key,
            # aios stopped/started or recreated the hosts: the head forgets the keys it pinned
            "reset_keys": self.reset_keys or self.runner.reset_marker.exists(),
            "python": HELPER_PYTHON,
        }
        if tasks is not None:
            req["tasks"] = {str(w): {"cmd": c, "stdin": i} for w, (c, i) in tasks.items()}
        else:
            req["cmd"] = cmd
            if len(hosts) != len(self.hosts):
                req["only"] = [h.worker_id for h in hosts]
        if send_hosts:  # reach, the first request of a launch, sends the host list
            req["hosts"] = every
        waves = -(-len(hosts) // FAN_PARALLEL)
        for _ in range(2):
            r, results, outputs, other = self._call(
                f"{HELPER_PYTHON} {helper} {sub} {self.root}",
                gzip.compress(json.dumps(req).encode(), 9),
                timeout=limit * (waves + 1) + retry_until + 60,
                echo=echo,
            )
            if r.returncode == 3 and "NEED_HOSTS" in other and "hosts" not in req:
                req["hosts"] = every
                continue
            break
        if r.ok and req["reset_keys"]:
            self.runner.reset_marker.unlink(missing_ok=True)
        if not r.ok or not results:
            raise self._head_failed(r, what)
        return results, outputs

    def check(
        self,
        results: dict[int, tuple[int, str]],
        what: str,
        outputs: dict[int, list[str]] | None = None,
    ) -> None:
        """Raise one line naming the hosts where ``what`` failed, each with its state and the
        last ``[aios]`` line it printed (the reason a setup check gave)."""
        bad = [(w, rc, st) for w, (rc, st) in sorted(results.items()) if rc != 0]
        if bad:

            def why(w: int, st: str) -> str:
                said = [ln for ln in (outputs or {}).get(w, []) if "[aios]" in ln]
                st = "no answer within the time limit" if st == "stalled" else st
                return f"{st}: {said[-1].split('[aios]', 1)[1].strip()}" if said else st

            names = "; ".join(f"worker {w}: {why(w, st)}" for w, _rc, st in bad[:5])
            more = f"; and {len(bad) - 5} more" if len(bad) > 5 else ""
            raise SshError(
                f"{what} failed on {len(bad)} of {len(results)} hosts ({names}{more})",
                "see the output above; rerun with --debug",
            )

    # -------------------------------------------------------------- phases
    def reach(self, timeout: float | None = None) -> None:
        """Wait for the head (from here), then for every other host (from the head, which
        installs its own key there through the forwarded agent the first time)."""
        limit = reach_timeout() if timeout is None else timeout
        start = time.monotonic()
        marker = self.runner.reset_marker
        self.reset_keys = marker.exists() or not self.runner.known_hosts.exists()
        self.runner.wait_reachable(limit, hosts=[self.head])
        self.ensure_helper()
        if len(self.hosts) == 1:
            marker.unlink(missing_ok=True)
            return
        left = max(5.0, limit - (time.monotonic() - start))
        results, _ = self.fan(
            "reachable",
            cmd="true",
            timeout=self.runner.connect_timeout + 20,
            retry_until=left,
            install_key=self.own_key is None,
            echo=False,
            send_hosts=True,
        )
        bad = [(w, st) for w, (rc, st) in sorted(results.items()) if rc != 0]
        if bad:
            names = ", ".join(f"worker {w} ({st})" for w, st in bad[:5])
            more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
            # the time it waited: a host whose key changed is given up on at once
            waited = min(limit, time.monotonic() - start)
            raise SshError(
                f"{len(bad)} of {len(results)} hosts not reachable from the head host after "
                f"{waited:.0f}s: {names}{more}",
                "check that those hosts are up and accept SSH on the cluster network",
            )
        marker.unlink(missing_ok=True)

    def sync(self, manifest: Any) -> tuple[int, int]:
        """Send the code to the head (only the blobs it lacks) and have it copy the code to
        every other host. Returns (bytes sent from here, blobs sent)."""
        helper = self.ensure_helper()
        before = self.sent
        payload = manifest.payload()
        r, _, _, other = self._call(
            f"{HELPER_PYTHON} {helper} have {self.root}",
            payload,
            timeout=command_timeout(),
            echo=False,
        )
        if not r.ok:
            raise self._head_failed(r, "code sync")
        missing = [ln.split()[1] for ln in other if ln.startswith("M ")]
        r, *_ = self._call(
            f"{HELPER_PYTHON} {helper} put {self.root}",
            manifest.blob_tar(missing) if missing else b"",
            timeout=command_timeout(),
        )
        if not r.ok:
            raise self._head_failed(r, "code sync")
        if len(self.hosts) > 1:
            results, _ = self.fan("synced", sub="sync", echo=True)
            self.check(results, "code sync")
        return self.sent - before, len(missing)


def run_via_head(
    rec: ClusterRecord,
    cmd: str,
    hosts: list[ClusterHost],
    printer: Callable[[str, str], None],
    timeout: float | None = None,
) -> list[int]:
    """``cmd`` on ``hosts`` through the head host (``aios exec``, ``aios logs``); straight
    from here (bounded, timed) when the head cannot be used. Exit codes in worker order."""
    try:
        results, _ = Head(rec, printer).fan("done", cmd=cmd, hosts=hosts, timeout=timeout)
        return [results.get(h.worker_id, (255, ""))[0] for h in hosts]
    except SshError as exc:
        printer("[aios]", f"{exc.message}; asking the hosts directly")
        runner = runner_for(rec, printer)
        return [r.returncode for r in runner.run(cmd, hosts=hosts, timeout=timeout)]
