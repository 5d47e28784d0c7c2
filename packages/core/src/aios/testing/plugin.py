"""The aios pytest plugin: fixtures for aios's own tests and for plugin authors' conformance tests.

Registered through the ``pytest11`` entry point of aios-core (``aios = "aios.testing.plugin"``),
so every pytest session with aios-core installed has it; nothing heavy is imported (no torch).

Fixtures:

* ``free_port``: a function returning a TCP port on 127.0.0.1 that nothing listens on.
* ``aios_cli``: ``aios_cli(*args, env=None, prog="aios", pythonpath=None, timeout=300,
  in_process=False)`` runs the ``aios`` (or ``aios-run``) CLI, in a subprocess with a clean
  environment (no ``AIOS_*``/``PJRT_*``/``TPU_*``/``NEURON_*`` from the caller, ``AIOS_HOME``
  under ``tmp_path``, cwd ``tmp_path``) or in this process; returns a
  :class:`subprocess.CompletedProcess` with ``returncode``, ``stdout``, ``stderr``.

The session starts a zygote (:mod:`aios.testing.zygote`) where torch is installed, from which
the commands of :func:`aios.testing.zygote.python` (``aios.testing.launch``'s ``aios-run`` among
them) fork instead of importing torch again; ``PYTEST_AIOS_ZYGOTE=0`` turns it off.

The session ends with an "aios: skipped tests" summary naming every skip reason and how many
tests it hit. ``_unavailable(reason)`` skips, or fails with ``CI`` set to a true value (a CI
machine that cannot run the test is misconfigured); aios-cloud's pytest plugin
(:mod:`aios_cloud.testing.plugin`, the ``sshd_cluster``/``sshd_hosts`` fixtures of real sshd
hosts) uses it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from aios.plugins.registry import reset_registry
from aios.testing import find_free_port, zygote

CLEAN_PREFIXES = ("AIOS_", "PJRT_", "TPU_", "NEURON_")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")


def _unavailable(reason: str) -> None:
    """Skip with ``reason``; under CI, fail: the machine should have been set up for it."""
    if in_ci():
        pytest.fail(
            f"{reason} (CI is set: a CI machine must be able to run this test; .ci/run installs it)",
            pytrace=False,
        )
    pytest.skip(reason)


@pytest.fixture
def free_port() -> Callable[[], int]:
    """``free_port()``: a TCP port on 127.0.0.1 that nothing listens on."""
    return find_free_port


@pytest.fixture
def aios_cli(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the ``aios`` / ``aios-run`` CLI and capture its exit code, stdout and stderr."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(CLEAN_PREFIXES)}
    base["AIOS_HOME"] = str(tmp_path / "aios-home")
    base["COLUMNS"] = "200"

    def run(
        *args: str,
        env: dict[str, str] | None = None,
        prog: str = "aios",
        pythonpath: list[Any] | None = None,
        timeout: float = 300,
        in_process: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        full = dict(base)
        if pythonpath:
            full["PYTHONPATH"] = os.pathsep.join(
                [str(p) for p in pythonpath] + [full.get("PYTHONPATH", "")]
            )
        full.update(env or {})
        mod = "aios.cli.main" if prog == "aios" else "aios.cli.run"
        if in_process:
            return _run_in_process(mod, prog, list(args), full, tmp_path)
        code = f"import sys; sys.argv[0] = {prog!r}; from {mod} import main; main()"
        return subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            env=full,
            cwd=tmp_path,
            timeout=timeout,
        )

    return run


def _run_in_process(
    mod: str, prog: str, args: list[str], env: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    import importlib

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_argv, saved_cwd = dict(os.environ), list(sys.argv), os.getcwd()
    code: Any = 0
    try:
        os.environ.clear()
        os.environ.update(env)
        sys.argv = [prog, *args]
        os.chdir(cwd)
        reset_registry()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                importlib.import_module(mod).main()
            except SystemExit as exc:
                code = exc.code
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        reset_registry()
    rc = code if isinstance(code, int) else (0 if code is None else 1)
    if code is not None and not isinstance(code, int):
        err.write(f"{code}\n")
    return subprocess.CompletedProcess([prog, *args], rc, out.getvalue(), err.getvalue())


# ------------------------------------------------------------------------------ loud skips


_ZYGOTE: list[Any] = []


def pytest_configure(config: Any) -> None:
    """Start the session's zygote (see the module docstring)."""
    if os.environ.get(zygote.ENV) or importlib.util.find_spec("torch") is None:
        return  # turned off, or a session inside a test that has one already
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLEAN_PREFIXES)}
    proc, path = zygote.start(env)
    if proc.poll() is None:
        os.environ[zygote.ENV] = path
        _ZYGOTE.extend([proc, path])


def pytest_unconfigure(config: Any) -> None:
    if _ZYGOTE:
        proc, path = _ZYGOTE
        zygote.stop(proc, path)
        _ZYGOTE.clear()
        os.environ.pop(zygote.ENV, None)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: Any) -> None:
    """Name every skip reason at the end of the session, with how many tests it skipped."""
    reasons: Counter[str] = Counter()
    for rep in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(rep, "longrepr", None)
        if isinstance(longrepr, tuple) and len(longrepr) == 3:
            reason = str(longrepr[2])
        else:
            reason = str(longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    if not reasons:
        return
    total = sum(reasons.values())
    terminalreporter.write_sep("=", f"aios: skipped tests ({total})", yellow=True)
    for reason, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
        terminalreporter.write_line(f"{n:4d} skipped: {reason}")
    if any("sshd" in r for r in reasons):
        terminalreporter.write_line(
            "     (real sshd hosts: apt-get install openssh-server openssh-client iproute2, as root; "
            "with CI=true these are failures, not skips)"
        )
