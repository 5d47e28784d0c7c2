"""``python -m aios_backend_xla.launcher [--nprocs N] [-m] SCRIPT [ARGS...]``

Runs an unchanged training script once per local TPU chip through ``torch_xla.launch`` (one
process per chip; ``--nprocs 1`` runs a single process). ``PJRT_DEVICE`` must be set explicitly
(aios's launch plan sets ``PJRT_DEVICE=TPU``); the launcher refuses to start when the XLA runtime
is already initialised in this process, the failure torch_xla reports only after spawning.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys

from aios.errors import AiosError, LaunchError
from aios.launcher.contract import LOCAL_INDEX_ENV

from aios_backend_xla.discovery import discover
from aios_backend_xla.launch import no_tpu_error


def _run(index: int, script: str, args: list[str], module: bool) -> None:
    """Per-process entry (module-level so that the ``spawn`` start method can pickle it)."""
    os.environ[LOCAL_INDEX_ENV] = str(index)
    sys.argv = [script, *args]
    if module:
        runpy.run_module(script, run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        runpy.run_path(script, run_name="__main__")


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m aios_backend_xla.launcher", description=__doc__.split("\n\n")[1]
    )
    p.add_argument(
        "--nprocs",
        default="auto",
        help="processes on this host: auto or the local chip count (one per chip), or 1",
    )
    p.add_argument(
        "-m", dest="module", action="store_true", help="run SCRIPT as a module (python -m)"
    )
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    return p.parse_args(argv)


CACHE_ENV = "XLA_PERSISTENT_CACHE_PATH"


def expand_cache_env(environ: dict[str, str] | os._Environ = os.environ) -> str | None:
    """Expand a ``~`` in ``XLA_PERSISTENT_CACHE_PATH`` before torch_xla reads it (it takes the
    path literally and would create a directory named ``~``). Returns the value in effect."""
    value = environ.get(CACHE_ENV)
    if value and value.startswith("~"):
        value = os.path.expanduser(value)
        environ[CACHE_ENV] = value
    return value


def main(argv: list[str] | None = None) -> int:
    ns = parse(sys.argv[1:] if argv is None else argv)
    expand_cache_env()
    try:
        if not os.environ.get("PJRT_DEVICE"):
            raise LaunchError(
                "PJRT_DEVICE is not set: torch_xla would silently fall back to CPU",
                "launch through aios-run --backend xla, or export PJRT_DEVICE=TPU",
            )
        if not (ns.nprocs == "auto" or ns.nprocs.isdigit() and int(ns.nprocs) >= 1):
            raise LaunchError(
                f"--nprocs {ns.nprocs} is not a process count",
                "use --nprocs auto, 1, or the number of local chips",
            )
        chips = None
        if os.environ["PJRT_DEVICE"].upper() == "TPU":
            facts = discover()
            if not facts.present:
                raise no_tpu_error(facts)
            chips = facts.pci_chips or None
        n = ns.nprocs
        if n not in ("auto", "1") and (chips is None or int(n) != chips):
            have = (
                f"the {chips} local chips" if chips else "one process (no TPU chips counted here)"
            )
            raise LaunchError(
                f"--nprocs {n}: torch_xla.launch starts one process per local chip or a single one, here {have}",
                "use --nprocs auto or --nprocs 1",
            )
        if not ns.module and not os.path.isfile(ns.script):
            raise LaunchError(
                f"script '{ns.script}' does not exist", "pass the path of the training script"
            )
        import torch_xla

        if torch_xla._XLAC._xla_runtime_is_initialized():
            raise LaunchError(
                "the XLA runtime is already initialised before launch (Runtime is already initialized)",
                "do not touch XLA devices before torch_xla.launch (e.g. in sitecustomize or imported modules)",
            )
    except AiosError as exc:
        print(f"aios-backend-xla launcher: error: {exc.one_line()}", file=sys.stderr)
        return exc.exit_code
    torch_xla.launch(
        _run, args=(ns.script, list(ns.args), ns.module), debug_single_process=ns.nprocs == "1"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
