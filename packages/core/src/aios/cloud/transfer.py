"""``aios sync`` transfers: buckets through fsspec (the registered storage schemes, with a byte
progress bar for large transfers) and cluster hosts through tar over SSH."""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from aios.errors import AiosError

PROGRESS_MIN_BYTES = 8 * 2**20


def _fs(url: str) -> tuple[Any, str]:
    from aios.checkpoint import filesystem

    return filesystem(url)


class _Bar:
    """A tqdm byte bar on stderr (only for transfers over PROGRESS_MIN_BYTES)."""

    def __init__(self, total: int, desc: str, enabled: bool) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, file=sys.stderr,
                            dynamic_ncols=True, mininterval=0.5)

    def callback(self) -> Any:
        from fsspec.callbacks import Callback

        bar = self.bar

        class _CB(Callback):
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
    from aios.cloud.codesync import _excluded

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


def copy_urls(src: str, dst: str, dry_run: bool = False, excludes: tuple[str, ...] = (), progress: bool | None = None) -> list[str]:
    """local -> bucket, bucket -> local, bucket -> bucket. Directories copy recursively."""
    lines: list[str] = []
    s_url, d_url = "://" in src, "://" in dst
    if dry_run:
        tool = "gcloud storage cp -r" if "gs://" in (src + dst) else ("aws s3 cp --recursive" if "s3://" in (src + dst) else "cp -r")
        return [f"{tool} {shlex.quote(src)} {shlex.quote(dst)}"]
    if not s_url:  # local -> bucket
        fs, base = _fs(dst)
        files = _local_files(Path(src), excludes)
        total = sum(p.stat().st_size for p, _ in files)
        bar = _Bar(total, f"upload {Path(src).name}", progress if progress is not None else total >= PROGRESS_MIN_BYTES)
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
        raise AiosError(f"{src} does not exist", "check the URL (aios sync lists nothing it cannot read)")
    if fs.isdir(base):
        found = [f for f in fs.find(base) if not fs.isdir(f)]
        pairs = [(f, f[len(base.rstrip('/')) + 1:]) for f in found]
    else:
        pairs = [(base, base.rsplit("/", 1)[-1])]
    total = sum(int(fs.info(f).get("size") or 0) for f, _ in pairs)
    bar = _Bar(total, f"download {src.rsplit('/', 1)[-1]}", progress if progress is not None else total >= PROGRESS_MIN_BYTES)
    try:
        if not d_url:  # bucket -> local
            single = len(pairs) == 1 and not fs.isdir(base) and not dst.endswith("/") and not Path(dst).is_dir()
            for f, rel in pairs:
                target = Path(dst) if single else Path(dst) / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                fs.get_file(f, str(target), callback=bar.callback())
        else:  # bucket -> bucket (through this machine)
            dfs, dbase = _fs(dst)
            with tempfile.TemporaryDirectory(prefix="aios-sync-") as tmp:
                for f, rel in pairs:
                    local = Path(tmp) / "x"
                    fs.get_file(f, str(local), callback=bar.callback())
                    dfs.put_file(str(local), f"{dbase.rstrip('/')}/{rel}" if len(pairs) > 1 or fs.isdir(base) else dbase)
    finally:
        bar.close()
    lines.append(f"copied {len(pairs)} files ({total / 2**20:.1f} MiB) from {src} to {dst}")
    return lines


def upload_to_cluster(src: Path, rec: Any, path: str, hosts: list[Any], printer: Callable[[str, str], None],
                      dry_run: bool, excludes: tuple[str, ...] = ()) -> list[str]:
    """local file/dir -> PATH on every selected host (relative paths: under the code dir)."""
    import tarfile

    from aios.cloud import ops

    dest = path if path.startswith(("/", "~", "$HOME")) else f"{ops.remote_root(rec.name)}/code/{path}"
    dest = dest.replace("~", "$HOME", 1) if dest.startswith("~") else dest
    into = path.endswith("/") or path in ("", ".")
    if into:  # PATH/ names a directory that receives src
        parent = dest.rstrip("/") or "."
    elif src.is_dir():  # PATH is the directory itself
        parent = dest
    else:  # PATH is the file
        parent = os.path.dirname(dest) or "."
    cmd = f"mkdir -p {parent} && tar xzf - -C {parent}"
    runner = ops.runner_for(rec, printer)
    if dry_run:
        return [f"tar czf - {shlex.quote(str(src))} | {shlex.join(runner.argv(h, cmd))}" for h in hosts]
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
        runner.check(runner.run(cmd, stdin_path=str(tar), hosts=hosts), "sync")
    return [f"copied {len(files)} files to {rec.name}:{path} on {len(hosts)} hosts"]


def download_from_cluster(rec: Any, path: str, hosts: list[Any], dst: Path, dry_run: bool) -> list[str]:
    """PATH on each selected host -> local ``dst`` (``dst/worker-N/`` when several hosts)."""
    import subprocess
    import tarfile

    from aios.cloud import ops

    src = path if path.startswith(("/", "$HOME")) else (path.replace("~", "$HOME", 1) if path.startswith("~") else f"{ops.remote_root(rec.name)}/code/{path}")
    parent, base = os.path.dirname(src.rstrip("/")) or "/", os.path.basename(src.rstrip("/"))
    cmd = f"tar czf - -C {parent} {shlex.quote(base)}"
    runner = ops.runner_for(rec)
    if dry_run:
        return [f"{shlex.join(runner.argv(h, cmd))} | tar xzf - -C {shlex.quote(str(dst))}" for h in hosts]
    out = []
    for h in hosts:
        target = dst / f"worker-{h.worker_id}" if len(hosts) > 1 else dst
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="aios-sync-") as tmp:
            tar = Path(tmp) / "down.tar.gz"
            with open(tar, "wb") as f:
                r = subprocess.run(runner.argv(h, cmd), stdout=f, stderr=subprocess.PIPE, text=False)
            if r.returncode != 0:
                raise AiosError(f"copy from {h.label} failed: {r.stderr.decode(errors='replace').strip()[:200]}", f"check that {path} exists there (`aios exec {rec.name} ls`)")
            with tarfile.open(tar) as t:
                t.extractall(target, filter="data")
        out.append(f"copied {rec.name}:{path} from worker {h.worker_id} to {target}")
    return out
