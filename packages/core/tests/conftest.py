"""Shared fixtures for core tests: installable fake distributions that register real entry points."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CORE_SRC = Path(__file__).resolve().parents[1] / "src"


def _write_dist(site: Path, dist: str, module: str, source: str, version: str = "1.0") -> None:
    """Write a minimal installed distribution (dist-info with an ``aios`` entry point) into
    ``site``: importlib.metadata discovers it exactly like a pip-installed plugin."""
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[aios]\n{dist} = {module}\n")


@pytest.fixture
def site(tmp_path: Path) -> Path:
    return tmp_path / "site"


@pytest.fixture
def run_aios(site: Path, tmp_path: Path):
    """Run the ``aios`` CLI in a subprocess with ``site`` on the path (fake plugins visible)."""

    def run(
        *args: str,
        env: dict[str, str] | None = None,
        module: str = "aios.cli.main",
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        full = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
        full["PYTHONPATH"] = os.pathsep.join([str(site), str(CORE_SRC)])
        full["AIOS_HOME"] = str(tmp_path / "home")
        full["COLUMNS"] = "200"
        full.update(env or {})
        code = f"import sys; sys.argv[0] = 'aios'; from {module} import main; main()"
        return subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            env=full,
            cwd=tmp_path,
            check=check,
            timeout=120,
        )

    return run


BACKEND_PLUGIN = """
    from aios import hookimpl
    from aios.types import Availability, BackendSpec

    @hookimpl
    def aios_register_backends(register):
        register(BackendSpec(name="{name}", priority={priority},
                             probe=lambda config=None: Availability({avail}, "no widget"),
                             install_hint="pip install widget"))
"""


@pytest.fixture
def write_dist():
    """``write_dist(site, dist, module, source, version)``: install a fake plugin distribution."""
    return _write_dist


@pytest.fixture
def backend_plugin():
    """Source of a plugin module registering one backend: ``backend_plugin(name, priority, avail)``."""
    return lambda name, priority=1, avail=True: BACKEND_PLUGIN.format(
        name=name, priority=priority, avail=avail
    )
