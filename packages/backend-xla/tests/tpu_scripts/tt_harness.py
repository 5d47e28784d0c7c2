"""Runs TorchTPU's real code on a machine without a TPU, in its own process.

TorchTPU finds chips with ``torch_tpu._internal.utils.hardware._scan_pci_tpus``: it lists
``/sys/bus/pci/devices``, keeps Google's vendor id 0x1ae0 with a TPU device id, and counts a chip
only when ``<dev>/iommu_group`` names a group present under ``/dev/vfio``. That module reads
both paths through its module-level ``pathlib``; this harness points those two paths (and only
those) at a fixture tree, so the real scanner, topology tables, device registration and launch
helper run unchanged on the fixture's chips. Nothing here runs a TPU op.

usage: python tt_harness.py SYSFS VFIO MODE [ARGS...]
  register                      import + register the tpu device; print facts as JSON
  launch_env NNODES|- NPROC|-   torch.tpu.distributed.set_tpu_launch_env; print the env as JSON
  step                          the example's training step on tpu under FakeTensorMode
or: python tt_harness.py --serve   the same runs, each in a process forked from this one

``--serve`` imports torch and torch_tpu once, exactly as a run does before its redirect (device
autoload off: nothing registered, nothing scanned, no PJRT client; libtpu.so is loaded, as in a
run), then reads one request per line on stdin, ``{"argv": [SYSFS, VFIO, MODE, ...], "env": {...},
"cwd": DIR}``, forks a process per request that goes on as ``python tt_harness.py ARGV`` would
from the same point (the request's environment with what the imports set in it, the request's
directory and ``sys.argv``; stdin from /dev/null) and ends as that would
(atexit, the interpreter's finalization), and answers each on stdout with one line,
``{"returncode": N, "stdout": ..., "stderr": ...}`` (N negative: killed by that signal, as
``subprocess`` reports it). A forked process is as isolated as a fresh one: its registration,
redirect and environment stay in its own copy of the server's memory, and a TPU op that aborts
ends only it. Checked here, not assumed:

* The environment: a request whose environment differs from the server's in a variable other
  than :data:`RUNTIME_VARS` is refused (the test module then starts a server for that
  environment). Those are read when used (``set_tpu_launch_env``, pytest), never while
  importing: the import reads none of them, in Python or through C ``getenv`` (checked once with
  a getenv-logging preload: torch's, numpy's, OpenMP's, absl's and libtpu's settings only), and
  the server checks that the import neither set one nor memoized a variable in torch_tpu's
  ``env_utils``.
* Threads: the import leaves numpy's OpenBLAS pool (a worker per extra core), which OpenBLAS
  stops before a fork (its ``pthread_atfork`` handler) and starts again on its next use; the
  server forks once at start-up, then insists that it runs one thread (``/proc/self/task``)
  before every fork, so no lock is held across one.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import pathlib
import signal
import sys
import tempfile
import types
from typing import Any

#: read when used, never while importing torch and torch_tpu: ``set_tpu_launch_env``'s launch
#: variables, and pytest's name of the running test (each run has its own): a request may differ
#: from the server's environment in these
RUNTIME_VARS = frozenset({"TPU_WORKER_HOSTNAMES", "JOB_COMPLETION_INDEX", "PYTEST_CURRENT_TEST"})
_PR_SET_PDEATHSIG = 1


def prepare() -> None:
    """What a run imports before it redirects the scanner: torch and torch_tpu, autoload off
    (the device is registered explicitly, after the redirect)."""
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    import torch  # noqa: F401
    import torch_tpu  # noqa: F401
    from torch_tpu._internal.utils import hardware  # noqa: F401


def install(sysfs: str, vfio: str) -> None:
    prepare()
    import torch_tpu
    from torch_tpu._internal.utils import hardware

    real = pathlib.Path
    maps = (("/sys/bus/pci/devices", sysfs), ("/dev/vfio", vfio))

    def path(p: object, *rest: str) -> pathlib.Path:
        s = str(p)
        for src, dst in maps:
            if s == src or s.startswith(src + "/"):
                s = dst + s[len(src) :]
        return real(s, *rest)

    hardware.pathlib = types.SimpleNamespace(Path=path)
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "1"
    torch_tpu._loader.load()


def register() -> dict:
    import torch
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    return {
        "is_available": torch.accelerator.is_available(),
        "device_count": torch.accelerator.device_count(),
        "current": str(torch.accelerator.current_accelerator()),
        "privateuse1": torch._C._get_privateuse1_backend_name(),
        "pg_backends": [b for b in torch.distributed.Backend.backend_list if b.startswith("tpu")],
        "fused_adamw_kernel": bool(
            torch._C._dispatch_has_kernel_for_dispatch_key("aten::_fused_adamw_", "PrivateUse1")
        ),
        "fused_devices": list(_get_fused_kernels_supported_devices()),
        "has_torch_tpu": hasattr(torch, "tpu"),
        "compile_backends": sorted(
            b for b in torch._dynamo.list_backends(exclude_tags=()) if "tpu" in b
        ),
    }


def launch_env(nnodes: str, nproc: str) -> dict:
    import torch

    before = dict(os.environ)
    kwargs = {}
    if nnodes != "-":
        kwargs["nnodes"] = int(nnodes)
    if nproc != "-":
        kwargs["nproc_per_node"] = int(nproc)
    torch.tpu.distributed.set_tpu_launch_env(**kwargs)
    return {k: v for k, v in os.environ.items() if before.get(k) != v}


def run(argv: list[str]) -> None:
    sysfs, vfio, mode, *args = argv
    install(sysfs, vfio)
    if mode == "register":
        out = register()
    elif mode == "launch_env":
        out = launch_env(*args)
    elif mode == "step":
        sys.path.insert(0, os.path.dirname(__file__))
        from tt_step import run_step

        out = run_step(*args)
    else:
        raise SystemExit(f"unknown mode {mode}")
    print("RESULT " + json.dumps(out))


# ------------------------------------------------------------------------------ --serve


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _threads() -> list[str]:
    return os.listdir("/proc/self/task")


def _refusal(base: dict[str, str], env: dict[str, str]) -> str | None:
    keys = sorted(k for k in set(base) | set(env) if base.get(k) != env.get(k))
    bad = [k for k in keys if k not in RUNTIME_VARS]
    return f"environment differs from the server's in {', '.join(bad)}" if bad else None


def serve() -> list[str]:
    """The server's loop (see the module's doc). Returns only in a forked process, with the
    arguments it then runs; the server itself ends when its stdin does."""
    _die_with_parent()
    answers = os.fdopen(os.dup(1), "w")  # the answers; the server's own prints go to stderr
    os.dup2(2, 1)
    base = dict(os.environ)
    prepare()
    after = dict(os.environ)  # with what the imports set (autoload off, TPU_LIBRARY_PATH)
    from torch_tpu._internal import env_utils

    if env_utils._resolved_values or any(base.get(k) != after.get(k) for k in RUNTIME_VARS):
        raise SystemExit("torch_tpu read or set a launch variable at import: fork unsafe")
    pid = os.fork()  # OpenBLAS stops its pool here, once
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    # what the imports made stays out of the collector's passes: a run's collections and its
    # interpreter's end do not write to (and so copy) every page it shares with the server
    gc.freeze()
    for line in sys.stdin:
        request = json.loads(line)
        why = _refusal(base, request["env"])
        if why is None and len(_threads()) != 1:
            why = f"the server runs {len(_threads())} threads: it cannot fork safely"
        if why is not None:
            answers.write(json.dumps({"refused": why}) + "\n")
            answers.flush()
            continue
        out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            answers.close()
            _become(request, base, after, out, err)
            return list(request["argv"])
        _, status = os.waitpid(pid, 0)
        answers.write(json.dumps(_answer(status, out, err)) + "\n")
        answers.flush()
    os._exit(0)


def _become(
    request: dict[str, Any], base: dict[str, str], after: dict[str, str], out: Any, err: Any
) -> None:
    """In the forked process: the streams, environment and directory of a fresh run at the
    same point (the request's environment with what the imports set in it)."""
    _die_with_parent()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    out.close()
    err.close()
    env = dict(request["env"])
    for k in set(base) | set(after):
        if base.get(k) != after.get(k):
            env.pop(k, None)
            if k in after:
                env[k] = after[k]
    os.environ.clear()
    os.environ.update(env)
    os.chdir(request["cwd"])
    sys.argv[1:] = request["argv"]


def _answer(status: int, out: Any, err: Any) -> dict[str, Any]:
    texts = []
    for f in (out, err):
        f.seek(0)
        texts.append(f.read().decode(errors="replace"))
        f.close()
    return {
        "returncode": os.waitstatus_to_exitcode(status),
        "stdout": texts[0],
        "stderr": texts[1],
    }


def main() -> None:
    if sys.argv[1:] == ["--serve"]:
        run(serve())
    else:
        run(sys.argv[1:])


if __name__ == "__main__":
    main()
