"""``aios sync`` transfers: buckets through fsspec (the registered storage schemes, with a byte
progress bar for large transfers) and cluster hosts through tar over SSH."""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aios.checkpoint import filesystem
from aios.errors import AiosError

from aios_cloud.codesync import _excluded
from aios_cloud.jobs import env_file
from aios_cloud.records import remote_root, runner_for

PROGRESS_MIN_BYTES = 8 * 2**20
TRANSFER_TIMEOUT = 86400.0  # `aios sync` to/from hosts: data may take hours


def _fs(url: str) -> tuple[Any, str]:
    return filesystem(url)


class _Bar:
    """A tqdm byte bar on stderr (only for transfers over PROGRESS_MIN_BYTES)."""

    def __init__(self, total: int, desc: str, enabled: bool) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(
                total=total,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=desc,
                file=sys.stderr,
                dynamic_ncols=True,
                mininterval=0.5,
            )

    def callback(self) -> Any:
        from fsspec.callbacks import Callback

        bar = self.bar

        class _CB(Callback):
            value: int | None

            def call(self, *args: Any, **kwargs: Any) -> None:
                pass

            def relative_update(self, inc: int = 1) -> None:
                if bar is not None:
                    bar.update(inc)

            def absolute_update(self, value: int) -> None:
                if bar is not None and self.value is not None:
                    bar.update(max(0, value - (self.value or 0)))
                self.value = value

        return _CB()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _local_files(root: Path, excludes: tuple[str, ...]) -> list[tuple[Path, str]]:
    if root.is_file():
        return [(root, root.name)]
    out = []
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            rel = p.relative_to(root).as_posix()
            if not _excluded(rel, excludes):
                out.append((p, rel))
    return sorted(out, key=lambda x: x[1])


def copy_urls(
    src: str,
    dst: str,
    dry_run: bool = False,
    excludes: tuple[str, ...] = (),
    progress: bool | None = None,
) -> list[str]:
    """local -> bucket, bucket -> local, bucket -> bucket. Directories copy recursively."""
    lines: list[str] = []
    s_url, d_url = "://" in src, "://" in dst
    if dry_run:
        tool = (
            "gcloud storage cp -r"
            if "gs://" in (src + dst)
            else ("aws s3 cp --recursive" if "s3://" in (src + dst) else "cp -r")
        )
        return [f"{tool} {shlex.quote(src)} {shlex.quote(dst)}"]
    if not s_url:  # local -> bucket
        fs, base = _fs(dst)
        files = _local_files(Path(src), excludes)
        total = sum(p.stat().st_size for p, _ in files)
        bar = _Bar(
            total,
            f"upload {Path(src).name}",
            progress if progress is not None else total >= PROGRESS_MIN_BYTES,
        )
        try:
            single = Path(src).is_file() and not dst.endswith("/")
            for p, rel in files:
                target = base if single else f"{base.rstrip('/')}/{rel}"
                fs.put_file(str(p), target, callback=bar.callback())
        finally:
            bar.close()
        lines.append(f"copied {len(files)} files ({total / 2**20:.1f} MiB) to {dst}")
        return lines
    fs, base = _fs(src)
    if not fs.exists(base):
        raise AiosError(
            f"{src} does not exist", "check the URL (aios sync lists nothing it cannot read)"
        )
    if fs.isdir(base):
        found = [f for f in fs.find(base) if not fs.isdir(f)]
        pairs = [(f, f[len(base.rstrip("/")) + 1 :]) for f in found]
    else:
        pairs = [(base, base.rsplit("/", 1)[-1])]
    total = sum(int(fs.info(f).get("size") or 0) for f, _ in pairs)
    bar = _Bar(
        total,
        f"download {src.rsplit('/', 1)[-1]}",
        progress if progress is not None else total >= PROGRESS_MIN_BYTES,
    )
    try:
        if not d_url:  # bucket -> local
            single = (
                len(pairs) == 1
                and not fs.isdir(base)
                and not dst.endswith("/")
                and not Path(dst).is_dir()
            )
            for f, rel in pairs:
                dest = Path(dst) if single else Path(dst) / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                fs.get_file(f, str(dest), callback=bar.callback())
        else:  # bucket -> bucket (through this machine)
            dfs, dbase = _fs(dst)
            with tempfile.TemporaryDirectory(prefix="aios-sync-") as tmp:
                for f, rel in pairs:
                    local = Path(tmp) / "x"
                    fs.get_file(f, str(local), callback=bar.callback())
                    dfs.put_file(
                        str(local),
                        f"{dbase.rstrip('/')}/{rel}" if len(pairs) > 1 or fs.isdir(base) else dbase,
                    )
    finally:
        bar.close()
    lines.append(f"copied {len(pairs)} files ({total / 2**20:.1f} MiB) from {src} to {dst}")
    return lines


def _remote_path(path: str) -> str:
    """A cluster-side path for a shell word: ``~/x`` -> ``"$HOME/x"``; relative paths stay
    relative (the command runs in the cluster's code dir)."""
    if path.startswith("~/") or path == "~":
        rest = (
            path[2:]
            .replace("\\", "\\\\")
            .replace('"', '\\"')
            .replace("$", "\\$")
            .replace("`", "\\`")
        )
        return f'"$HOME/{rest}"'
    if path.startswith("$HOME"):
        return f'"{path}"'
    return shlex.quote(path or ".")


def bucket_cluster(
    src: str,
    dst: str,
    rec: Any,
    hosts: list[Any],
    python: str,
    printer: Callable[[str, str], None],
    dry_run: bool,
    env: dict[str, str] | None = None,
    excludes: tuple[str, ...] = (),
) -> list[str]:
    """bucket -> PATH on every selected host, or PATH on the selected hosts -> bucket. The copy
    runs *on the hosts* (``python -m aios_cloud.transfer``, the same fsspec code as a local
    ``aios sync``, with the aios shipped by ``aios launch``), so the data never passes through
    this machine and the hosts use their own credentials (service account / instance profile).
    ``env`` (endpoints, forwarded credentials) reaches the hosts on stdin, never on a command
    line. Relative cluster paths are under the cluster's code dir."""

    root = remote_root(rec.name)
    to_cluster = "://" in src
    words = [
        _remote_path(w) if i == (1 if to_cluster else 0) else shlex.quote(w)
        for i, w in enumerate((src, dst))
    ]
    extra = "".join(f" --exclude {shlex.quote(x)}" for x in excludes)
    cmd = (
        f"set -a; . /dev/stdin; set +a; mkdir -p {root}/code && cd {root}/code && "
        f'export PYTHONPATH="{root}/code/.aios-site${{PYTHONPATH:+:$PYTHONPATH}}" && '
        f"{shlex.quote(python)} -m aios_cloud.transfer {words[0]} {words[1]}{extra}"
    )
    runner = runner_for(rec, printer)
    if dry_run:
        return [f"({h.label}) {shlex.join(runner.argv(h, cmd))}" for h in hosts]

    with tempfile.TemporaryDirectory(prefix="aios-sync-") as tmp:
        p = Path(tmp) / "env"
        fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(env_file(env or {}))
        # data can be large: a day's limit (Ctrl-C ends it at once)
        results = runner.run(cmd, stdin_path=str(p), hosts=hosts, timeout=TRANSFER_TIMEOUT)
    bad = [r for r in results if not r.ok]
    if bad:
        r = bad[0]
        detail = next(
            (ln for ln in reversed(r.stderr) if ln.strip()), f"exit status {r.returncode}"
        )
        if "No module named" in detail and "aios" in detail:
            fix = (
                f"aios is not on {rec.name} yet: run a job there first (`aios launch --name "
                f"{rec.name} ...` ships it), or install aios on the image"
            )
        else:
            fix = "check the URL and that the hosts can reach the bucket (pass endpoints/credentials with --env NAME)"
        raise AiosError(
            f"sync on {len(bad)} of {len(results)} hosts failed ({r.host.label}: {detail.strip()[:200]})",
            fix,
        )
    where = f"{rec.name}:{(dst if to_cluster else src)}"
    return [
        f"copied {src} to {where} on {len(hosts)} hosts"
        if to_cluster
        else f"copied {where} from worker {hosts[0].worker_id} to {dst}"
    ]


def main(argv: list[str] | None = None) -> int:
    """``python -m aios_cloud.transfer SRC DST [--exclude GLOB]``: what ``aios sync`` runs on the
    hosts for bucket <-> cluster copies. Exit 2 with one line on bad input."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m aios_cloud.transfer")
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--exclude", action="append", default=[])
    a = ap.parse_args(argv)
    try:
        for line in copy_urls(a.src, a.dst, excludes=tuple(a.exclude), progress=False):
            print(line, flush=True)
    except AiosError as exc:
        print(f"aios sync: error: {exc.one_line()}", file=sys.stderr)
        return exc.exit_code
    return 0


def upload_to_cluster(
    src: Path,
    rec: Any,
    path: str,
    hosts: list[Any],
    printer: Callable[[str, str], None],
    dry_run: bool,
    excludes: tuple[str, ...] = (),
) -> list[str]:
    """local file/dir -> PATH on every selected host (relative paths: under the code dir)."""
    import tarfile

    dest = path if path.startswith(("/", "~", "$HOME")) else f"{remote_root(rec.name)}/code/{path}"
    dest = dest.replace("~", "$HOME", 1) if dest.startswith("~") else dest
    into = path.endswith("/") or path in ("", ".")
    if into:  # PATH/ names a directory that receives src
        parent = dest.rstrip("/") or "."
    elif src.is_dir():  # PATH is the directory itself
        parent = dest
    else:  # PATH is the file
        parent = os.path.dirname(dest) or "."
    cmd = f"mkdir -p {parent} && tar xzf - -C {parent}"
    runner = runner_for(rec, printer)
    if dry_run:
        return [
            f"tar czf - {shlex.quote(str(src))} | {shlex.join(runner.argv(h, cmd))}" for h in hosts
        ]
    files = _local_files(src, excludes)
    with tempfile.TemporaryDirectory(prefix="aios-sync-") as tmp:
        tar = Path(tmp) / "up.tar.gz"
        with tarfile.open(tar, "w:gz") as t:
            for p, rel in files:
                if src.is_dir():
                    arc = f"{src.name}/{rel}" if into else rel
                else:
                    arc = src.name if into else os.path.basename(dest)
                t.add(str(p), arcname=arc)
        runner.check(
            runner.run(cmd, stdin_path=str(tar), hosts=hosts, timeout=TRANSFER_TIMEOUT), "sync"
        )
    return [f"copied {len(files)} files to {rec.name}:{path} on {len(hosts)} hosts"]


def download_from_cluster(
    rec: Any, path: str, hosts: list[Any], dst: Path, dry_run: bool
) -> list[str]:
    """PATH on each selected host -> local ``dst`` (``dst/worker-N/`` when several hosts)."""
    import subprocess
    import tarfile

    src = (
        path
        if path.startswith(("/", "$HOME"))
        else (
            path.replace("~", "$HOME", 1)
            if path.startswith("~")
            else f"{remote_root(rec.name)}/code/{path}"
        )
    )
    parent, base = os.path.dirname(src.rstrip("/")) or "/", os.path.basename(src.rstrip("/"))
    cmd = f"tar czf - -C {parent} {shlex.quote(base)}"
    runner = runner_for(rec)
    if dry_run:
        return [
            f"{shlex.join(runner.argv(h, cmd))} | tar xzf - -C {shlex.quote(str(dst))}"
            for h in hosts
        ]
    out = []
    for h in hosts:
        target = dst / f"worker-{h.worker_id}" if len(hosts) > 1 else dst
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="aios-sync-") as tmp:
            tar = Path(tmp) / "down.tar.gz"
            with open(tar, "wb") as f:
                r = subprocess.run(
                    runner.argv(h, cmd),
                    stdout=f,
                    stderr=subprocess.PIPE,
                    text=False,
                    timeout=TRANSFER_TIMEOUT,
                )
            if r.returncode != 0:
                raise AiosError(
                    f"copy from {h.label} failed: {r.stderr.decode(errors='replace').strip()[:200]}",
                    f"check that {path} exists there (`aios exec {rec.name} ls`)",
                )
            with tarfile.open(tar) as t:
                t.extractall(target, filter="data")
        out.append(f"copied {rec.name}:{path} from worker {h.worker_id} to {target}")
    return out


if __name__ == "__main__":
    sys.exit(main())
