"""The head host's side of a launch: ``python3 fleet.py SUBCOMMAND ROOT`` on worker 0, driving
the other hosts over the cluster network so the launching machine talks to one place.

This file runs on the hosts with their system ``python3`` (3.8 or newer) *before* aios is
installed there, so it uses the standard library only and imports nothing from aios. The
launcher ships it to ``ROOT/fleet/fleet.py`` (``ROOT`` = ``~/aios/<cluster>``) when its hash
differs. Subcommands (requests arrive gzip-compressed JSON on stdin; replies are lines on stdout:
``O <worker> <text>`` output, ``P <text>`` progress, ``R <worker> <rc> <state>`` one per host):

* ``have``: stdin is the code manifest (``[[path, sha, mode], ...]``); prints ``M <sha>`` for
  each content blob this host lacks (the blob store is ``ROOT/fleet/blobs``).
* ``put``: stdin is a tar of the missing blobs (named by hash); builds ``ROOT/code`` from the
  manifest (atomically replacing the old one) and drops blobs no longer referenced.
* ``fan``: runs one command per host (``hosts``, ``tasks``/``cmd``, ``timeout``, ``parallel``,
  ``what``, ``retry_until``, ``install_key``) on a bounded pool: worker 0 locally, the others
  over ssh with the head's own key (``ROOT/fleet/id_ed25519``; installed on the other hosts
  the first time through the launcher's forwarded agent). Every task has a timeout; a progress
  line names the host waited for every 10 s.
* ``sync``: copies the head's code to every other host the same way (manifest, then only the
  blobs each host lacks).
* ``tail``: follows ``worker.log`` of a job on every host; ends when stdin closes.

Host keys of the other hosts are pinned in ``ROOT/fleet/known_hosts``; a changed one is reported
as state ``replaced``.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from typing import Any

PROGRESS_EVERY = 10.0
_CHILDREN: set[subprocess.Popen[bytes]] = set()
_LOCK = threading.Lock()
_OUT = threading.Lock()


# the head's key to the other hosts: its public half goes into their authorized_keys with this
# comment and the cluster's name, which is how `aios down` on hosts a user owns finds that line
HEAD_KEY_COMMENT = "aios-head"
KEYGEN = ["ssh-keygen", "-q", "-t", "ed25519", "-N", ""]


def emit(line: str) -> None:
    with _OUT:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _spawn(argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(argv, start_new_session=True, **kw)
    with _LOCK:
        _CHILDREN.add(p)
    return p


def _kill(p: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_children(*_a: object) -> None:
    with _LOCK:
        procs = list(_CHILDREN)
    for p in procs:
        if p.poll() is None:
            _kill(p)


def _control_dir() -> str:
    d = f"/tmp/aios-fleet-{os.getuid()}"  # short: socket paths are limited to ~100 bytes
    os.makedirs(d, mode=0o700, exist_ok=True)
    return d


def _read_request() -> dict:
    data = sys.stdin.buffer.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return json.loads(data.decode() or "{}")


def _ago(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


#: what ssh's error text says about a host, in a few words (also :mod:`aios_cloud.ssh`'s)
CONNECTION_FAILURES = (
    ("refused", "connection refused"),
    ("timed out", "connection timed out"),
    ("no route", "no route to host"),
    ("unreachable", "network unreachable"),
    ("reset", "connection reset"),
    ("closed", "connection closed"),
    ("permission denied", "login refused"),
)


def connection_failure(err: str) -> str | None:
    """The connection failure ssh's error text names, or None."""
    low = err.lower()
    return next((word for pat, word in CONNECTION_FAILURES if pat in low), None)


def state_of(rc: int, err: str) -> str:
    if rc == 124:
        return "stalled"
    low = err.lower()
    if "remote host identification has changed" in low or "host key verification failed" in low:
        return "replaced"
    return connection_failure(err) or f"exit {rc}"


# ------------------------------------------------------------------------------ code sync


def _blobs(root: str) -> str:
    d = os.path.join(root, "fleet", "blobs")
    os.makedirs(d, exist_ok=True)
    return d


def cmd_have(root: str) -> int:
    files = _read_request()["files"]
    d = _blobs(root)
    tmp = os.path.join(root, "fleet", "manifest.new.json")
    with open(tmp + ".tmp", "w") as f:
        json.dump(files, f)
    os.replace(tmp + ".tmp", tmp)
    seen = set()
    for _path, sha, _mode in files:
        if sha not in seen and not os.path.exists(os.path.join(d, sha)):
            emit("M " + sha)
        seen.add(sha)
    return 0


def cmd_put(root: str) -> int:
    d = _blobs(root)
    data = sys.stdin.buffer.read()
    if data:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            for m in tar.getmembers():
                name = os.path.basename(m.name)
                src = tar.extractfile(m)
                if src is None or not all(c in "0123456789abcdef" for c in name):
                    continue
                body = src.read()
                if hashlib.sha256(body).hexdigest()[: len(name)] != name:
                    emit(f"P blob {name} arrived corrupted")
                    return 4
                with open(os.path.join(d, name + ".tmp"), "wb") as f:
                    f.write(body)
                os.replace(os.path.join(d, name + ".tmp"), os.path.join(d, name))
    with open(os.path.join(root, "fleet", "manifest.new.json")) as f:
        files = json.load(f)
    # code/ is updated in place, file by file (each written beside and renamed over): a file
    # the last sync wrote and this one does not is removed; whatever else is there (runs/ and
    # checkpoints a job wrote under the code directory) is the job's and stays
    code = os.path.join(root, "code")
    try:
        with open(os.path.join(root, "fleet", "manifest.json")) as f:
            before = {path for path, _sha, _mode in json.load(f)}
    except (OSError, ValueError):
        before = set()
    used = set()
    for path, sha, mode in files:
        dest = os.path.join(code, path)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        tmp = dest + ".aios-sync"
        blob = os.path.join(d, sha)
        used.add(sha)
        if os.path.lexists(tmp):
            os.unlink(tmp)
        if mode == "l":
            with open(blob) as f:
                os.symlink(f.read(), tmp)
        else:
            shutil.copyfile(blob, tmp)
            os.chmod(tmp, int(mode, 8))
        if os.path.isdir(dest) and not os.path.islink(dest):
            os.unlink(tmp)
            emit(f"P {path}: a directory is in the way on this host (not replaced)")
            return 4
        os.replace(tmp, dest)
    for path in before - {path for path, _sha, _mode in files}:
        try:
            os.unlink(os.path.join(code, path))
        except (FileNotFoundError, IsADirectoryError):
            pass
    os.replace(
        os.path.join(root, "fleet", "manifest.new.json"),
        os.path.join(root, "fleet", "manifest.json"),
    )
    for name in os.listdir(d):
        if name not in used:
            os.unlink(os.path.join(d, name))
    emit(f"OK {len(files)}")
    return 0


# ------------------------------------------------------------------------------ fan-out


class Fleet:
    def __init__(self, root: str, req: dict[str, Any]) -> None:
        self.root = root
        self.req = req
        self.fleet = os.path.join(root, "fleet")
        os.makedirs(self.fleet, exist_ok=True)
        self.hosts = req.get("hosts") or self._cached_hosts(str(req.get("hosts_ref") or ""))
        self.me = req.get("self", 0)
        self.key = os.path.join(self.fleet, "id_ed25519")
        if req.get("reset_keys"):  # the launcher re-pinned its keys: the hosts were recreated
            try:
                os.unlink(os.path.join(self.fleet, "known_hosts"))
            except FileNotFoundError:
                pass
        if len(self.hosts) > 1 and not os.path.exists(self.key):
            subprocess.run(
                [*KEYGEN, "-C", f"{HEAD_KEY_COMMENT} {os.path.basename(root)}", "-f", self.key],
                check=True,
                capture_output=True,
            )

    def _cached_hosts(self, ref: str) -> list[dict[str, Any]]:
        """The host list sent by an earlier request (``hosts_ref`` is its hash): polls and
        commands do not send the host list again. Missing: exit 3, the launcher resends it."""
        try:
            with open(os.path.join(self.fleet, f"hosts-{ref}.json")) as f:
                return json.load(f)
        except (OSError, ValueError, TypeError):
            emit("NEED_HOSTS")
            sys.exit(3)

    def remember_hosts(self) -> None:
        ref = self.req.get("hosts_ref")
        if ref and self.req.get("hosts"):
            path = os.path.join(self.fleet, f"hosts-{ref}.json")
            if not os.path.exists(path):
                for name in os.listdir(self.fleet):
                    if name.startswith("hosts-"):
                        os.unlink(os.path.join(self.fleet, name))
                with open(path + ".tmp", "w") as f:
                    json.dump(self.req["hosts"], f)
                os.replace(path + ".tmp", path)

    def argv(self, h: dict, cmd: str, timeout: float = 0) -> list:
        if h["w"] == self.me:
            return ["bash", "-c", cmd]
        if timeout:  # the host ends the command itself too: a dropped ssh leaves nothing behind
            cmd = f"timeout -k 5 {int(timeout) + 1} bash -c {shlex.quote(cmd)}"
        return [
            "ssh",
            "-i",
            self.key,
            "-p",
            str(h.get("port", 22)),
            "-o",
            "BatchMode=yes",
            "-o",
            f"ConnectTimeout={int(self.req.get('connect_timeout', 10))}",
            "-o",
            "ServerAliveInterval=15",
            "-o",
            "ServerAliveCountMax=4",
            "-o",
            "UserKnownHostsFile={}".format(os.path.join(self.fleet, "known_hosts")),
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=accept-new",
            "-o",
            f"HostKeyAlias=aios-w{h['w']}",
            "-o",
            "LogLevel=ERROR",
            # one connection per host, reused by every later poll/command (60 s idle)
            "-o",
            "ControlMaster=auto",
            "-o",
            f"ControlPath={_control_dir()}/%C",
            "-o",
            "ControlPersist=60",
            "{}@{}".format(h["user"], h["ip"]) if h.get("user") else h["ip"],
            cmd,
        ]

    def run_task(
        self,
        h: dict[str, Any],
        cmd: str,
        stdin: bytes,
        timeout: float,
        stream: bool,
        agent: bool = False,
    ) -> tuple[int, list[str], list[str]]:
        """Run ``cmd`` on host ``h``. The launcher's forwarded agent is used only with
        ``agent`` (first contact, to install the head's key): every later connection
        authenticates with the head's own key and costs the launching machine nothing."""
        env = dict(os.environ)
        if not agent:
            env.pop("SSH_AUTH_SOCK", None)
        p = _spawn(
            self.argv(h, cmd, timeout),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        err: list[str] = []

        def pump(src: Any, sink: list[str], is_err: bool) -> None:
            for raw in iter(src.readline, b""):
                line = raw.decode(errors="replace").rstrip("\n")
                sink.append(line)
                if stream and not (is_err and line.startswith("Warning: Permanently")):
                    emit(f"O {h['w']} {line}")

        out: list[str] = []
        t1 = threading.Thread(target=pump, args=(p.stdout, out, False), daemon=True)
        t2 = threading.Thread(target=pump, args=(p.stderr, err, True), daemon=True)
        t1.start()
        t2.start()

        def feed() -> None:
            assert p.stdin is not None
            try:
                if stdin:
                    p.stdin.write(stdin)
                p.stdin.close()
            except OSError:
                pass

        threading.Thread(target=feed, daemon=True).start()
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(p)
            p.wait()
            rc = 124
        with _LOCK:
            _CHILDREN.discard(p)
        t1.join(5)
        t2.join(5)
        return rc, out, err

    def fan(self, tasks: dict, what: str) -> dict:
        """Run ``tasks`` (worker -> (cmd, stdin bytes)); returns worker -> (rc, state)."""
        timeout = float(self.req.get("timeout", 600))
        retry_until = float(self.req.get("retry_until", 0))
        stream = bool(self.req.get("stream", True))
        parallel = max(1, int(self.req.get("parallel", 32)))
        start = time.monotonic()
        order = [h for h in self.hosts if str(h["w"]) in tasks]
        pending = list(order)
        results = {}
        running = {}
        lock = threading.Lock()
        cv = threading.Condition(lock)
        total = len(order)

        def worker() -> None:
            while True:
                with lock:
                    if not pending:
                        return
                    h = pending.pop(0)
                    running[h["w"]] = (time.monotonic(), "running")
                cmd, stdin = tasks[str(h["w"])]
                delay = 1.0
                use_agent = False
                while True:
                    rc, out, err = self.run_task(h, cmd, stdin, timeout, stream, use_agent)
                    st = "ok" if rc == 0 else state_of(rc, "\n".join(err))
                    if st == "login refused" and self.req.get("install_key") and not use_agent:
                        use_agent = True  # the head's key is not there yet: install it
                        continue
                    # a host that just booted can accept connections before its keys are in
                    # place (cloud-init and the guest agents install them after sshd starts):
                    # while a reach waits, a refused login is tried again like a lost connection
                    transient = rc == 255 and not out and st != "replaced"
                    left = retry_until - (time.monotonic() - start)
                    if transient and left > 0:  # tried again until the deadline, the last at it
                        with lock:
                            running[h["w"]] = (running[h["w"]][0], st)
                        time.sleep(min(delay, left))
                        delay = min(delay * 2, 10)
                        continue
                    break
                if rc != 0 and not stream:
                    for line in (err or out)[-3:]:
                        emit(f"O {h['w']} {line}")
                with lock:
                    running.pop(h["w"], None)
                    results[h["w"]] = (rc, st)
                    cv.notify_all()

        threads = [
            threading.Thread(target=worker, daemon=True) for _ in range(min(parallel, total))
        ]
        for t in threads:
            t.start()
        last = time.monotonic()
        with lock:
            while len(results) < total:
                cv.wait(1.0)
                now = time.monotonic()
                if now - last >= PROGRESS_EVERY and running:
                    last = now
                    w, (t0, st) = min(running.items(), key=lambda kv: kv[1][0])
                    emit(
                        f"P {what} {len(results)}/{total}, waiting for worker {w} ({st}, {_ago(now - start)})"
                    )
        return results

    def report(self, results: dict) -> None:
        for w in sorted(results):
            rc, st = results[w]
            emit(f"R {w} {rc} {st}")


def _tasks(req: dict, hosts: list) -> dict:
    if "tasks" in req:
        return {w: (t["cmd"], (t.get("stdin") or "").encode()) for w, t in req["tasks"].items()}
    only = req.get("only")  # a subset of the hosts (aios exec/logs --worker)
    return {
        str(h["w"]): (req["cmd"], (req.get("stdin") or "").encode())
        for h in hosts
        if only is None or h["w"] in only
    }


def cmd_fan(root: str) -> int:
    req = _read_request()
    fl = Fleet(root, req)
    fl.remember_hosts()
    tasks = _tasks(req, fl.hosts)
    if req.get("install_key") and len(fl.hosts) > 1:
        with open(fl.key + ".pub") as f:
            pub = f.read().strip()
        q = "'" + pub.replace("'", "'\\''") + "'"
        install = (
            f"mkdir -p ~/.ssh && chmod 700 ~/.ssh && (grep -qxF {q} ~/.ssh/authorized_keys "
            f"2>/dev/null || echo {q} >> ~/.ssh/authorized_keys) && "
        )
        tasks = {w: (c if w == str(fl.me) else install + c, s) for w, (c, s) in tasks.items()}
    fl.report(fl.fan(tasks, req.get("what", "done")))
    return 0


def cmd_sync(root: str) -> int:
    """Copy this host's code to every other host: each gets the manifest and only the blobs
    it lacks (``have`` there, then ``put``)."""
    req = _read_request()
    fl = Fleet(root, req)
    fl.remember_hosts()
    others = [h for h in fl.hosts if h["w"] != fl.me]
    with open(os.path.join(root, "fleet", "manifest.json")) as f:
        files = json.load(f)
    me = os.path.abspath(__file__)
    with open(me, "rb") as fb:
        helper = fb.read()
    manifest = gzip.compress(json.dumps({"files": files}).encode())
    remote = '"$HOME/{}"'.format(os.path.relpath(root, os.path.expanduser("~")))
    py = req.get("python", "python3")
    # one tar: the helper itself and the manifest
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, body in (("fleet.py", helper), ("manifest.gz", manifest)):
            ti = tarfile.TarInfo(name)
            ti.size = len(body)
            tar.addfile(ti, io.BytesIO(body))
    have_cmd = (
        f"mkdir -p {remote}/fleet && tar xf - -C {remote}/fleet && "
        f"{py} {remote}/fleet/fleet.py have {remote} < {remote}/fleet/manifest.gz"
    )
    missing = {}
    timeout = float(req.get("timeout", 600))
    results = {}
    pool = [h for h in others]
    lock = threading.Lock()
    blobs = _blobs(root)

    def worker() -> None:
        while True:
            with lock:
                if not pool:
                    return
                h = pool.pop(0)
            rc, out, err = fl.run_task(h, have_cmd, buf.getvalue(), timeout, False)
            if rc != 0:
                st = state_of(rc, "\n".join(err))
                for line in err[-3:]:
                    emit(f"O {h['w']} {line}")
                with lock:
                    results[h["w"]] = (rc, st)
                continue
            need = [ln.split()[1] for ln in out if ln.startswith("M ")]
            b = io.BytesIO()
            with tarfile.open(fileobj=b, mode="w:gz", compresslevel=1) as tar:
                for sha in need:
                    tar.add(os.path.join(blobs, sha), arcname=sha)
            missing[h["w"]] = len(need)
            put_cmd = f"{py} {remote}/fleet/fleet.py put {remote}"
            rc, out, err = fl.run_task(h, put_cmd, b.getvalue(), timeout, False)
            st = "ok" if rc == 0 else state_of(rc, "\n".join(err))
            if rc != 0:
                for line in (err or out)[-3:]:
                    emit(f"O {h['w']} {line}")
            with lock:
                results[h["w"]] = (rc, st)

    threads = [
        threading.Thread(target=worker, daemon=True)
        for _ in range(min(int(req.get("parallel", 32)), max(1, len(others))))
    ]
    start = time.monotonic()
    for t in threads:
        t.start()
    last = start
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(1.0)
        now = time.monotonic()
        if now - last >= PROGRESS_EVERY:
            last = now
            with lock:
                done = len(results)
            left = [h["w"] for h in others if h["w"] not in results]
            emit(
                f"P synced {done}/{len(others)}, waiting for worker {left[0] if left else '-'} ({_ago(now - start)})"
            )
    results[fl.me] = (0, "ok")
    emit(f"P blobs sent per host: {sorted(set(missing.values())) or [0]}")
    fl.report(results)
    return 0


def cmd_tail(root: str) -> int:
    """Follow ``worker.log`` of a job on every host (one ssh per other host *here*, on the
    cluster network); ends when this command's stdin closes (the launcher stopped following)."""
    line = b""
    while not line.endswith(b"\n"):  # unbuffered: stdin stays open until the launcher stops
        c = os.read(0, 1)
        if not c:
            break
        line += c
    req = json.loads(line.decode())
    fl = Fleet(root, req)
    start = "+1" if req.get("from_start", True) else "0"
    # the remote tail ends when its ssh does (stdin closes), never lingers on the host
    cmd = (
        f"tail -n {start} -F {req['jobdir']}/worker.log 2>/dev/null & t=$!; "
        "cat > /dev/null; kill $t 2>/dev/null"
    )
    sel = selectors.DefaultSelector()
    procs = []
    for h in fl.hosts:
        p = _spawn(
            fl.argv(h, cmd),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        procs.append(p)
        assert p.stdout is not None
        os.set_blocking(p.stdout.fileno(), False)
        sel.register(p.stdout, selectors.EVENT_READ, (h["w"], [b""]))
    sel.register(0, selectors.EVENT_READ, None)
    try:
        while True:
            for key, _ in sel.select(timeout=30):
                if key.data is None:  # stdin: EOF means the launcher is gone
                    if not os.read(0, 4096):
                        return 0
                    continue
                w, buf = key.data
                chunk = key.fileobj.read()  # type: ignore[union-attr]  # a pipe, registered above
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf[0] += chunk
                *lines, buf[0] = buf[0].split(b"\n")
                for line in lines:
                    emit(f"O {w} {line.decode(errors='replace')}")
    except BrokenPipeError:
        return 0
    finally:
        kill_children()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    sub, root = argv[0], os.path.expanduser(argv[1])
    try:  # one ssh per host at a time (tail: per host): use the hard open-file limit
        import resource

        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGHUP, lambda *_: sys.exit(129))
    try:
        return {
            "have": cmd_have,
            "put": cmd_put,
            "fan": cmd_fan,
            "sync": cmd_sync,
            "tail": cmd_tail,
        }[sub](root)
    except BrokenPipeError:  # the launcher went away: stop what this started
        return 141
    finally:
        kill_children()


if __name__ == "__main__":
    sys.exit(main())
