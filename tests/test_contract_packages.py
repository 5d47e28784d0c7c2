"""Every first-party package registers through entry points exactly like a third-party one,
installs from this checkout, and imports without its heavy runtime."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import distribution
from pathlib import Path

import tomllib

BLOCKER = """
import importlib.abc, sys
BLOCKED = ("torch", "torch_xla", "torch_neuronx", "neuronx_distributed", "deepspeed", "boto3",
           "botocore", "google", "gcsfs", "s3fs", "pynvml")
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"blocked heavy import: {name}")
        return None
sys.meta_path.insert(0, Block())
"""


def test_every_package_has_pyproject_readme_changelog_version_and_tests(root, first_party):
    for dist, folder in first_party.items():
        pkg = root / "packages" / folder
        meta = tomllib.loads((pkg / "pyproject.toml").read_text())
        assert meta["project"]["name"] == dist
        assert meta["build-system"]["build-backend"] == "hatchling.build"
        assert (pkg / "README.md").stat().st_size > 500, f"{dist}: README too thin"
        assert (pkg / "CHANGELOG.md").is_file(), dist
        assert list((pkg / "tests").glob("test_*.py")), f"{dist} has no tests"
        assert list((pkg / "src").glob("*/__about__.py")), (
            f"{dist} has no __about__.py version file"
        )


def test_every_first_party_package_registers_through_its_own_entry_point(root, first_party):
    for dist, folder in first_party.items():
        meta = tomllib.loads((root / "packages" / folder / "pyproject.toml").read_text())
        eps = meta["project"]["entry-points"]["aios"]
        assert list(eps) == [dist], f"{dist}: the entry-point name must equal the distribution name"
        installed = [ep for ep in distribution(dist).entry_points if ep.group == "aios"]
        assert [(ep.name, ep.value) for ep in installed] == [(dist, eps[dist])]


def test_installed_packages_come_from_this_checkout(root, first_party):
    import aios

    assert Path(aios.__file__).resolve().is_relative_to(root / "packages" / "core" / "src")
    for dist, folder in first_party.items():
        d = distribution(dist)
        direct = d.read_text("direct_url.json")
        assert direct, f"{dist} was not installed from a local path"
        url = json.loads(direct)["url"]
        assert url == (root / "packages" / folder).as_uri(), (dist, url)


def test_registry_loads_all_first_party_plugins_without_errors(aios_cli, first_party):
    res = aios_cli("plugins", "--json", env={"AIOS_STRICT_PLUGINS": "1"})
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["errors"] == []
    names = {p["name"] for p in data["plugins"]}
    assert set(first_party) <= names
    backends = {b for p in data["plugins"] for b in p["backends"]}
    clouds = {c for p in data["plugins"] for c in p["clouds"]}
    assert {"cpu", "cuda", "xla", "neuron"} <= backends
    assert {"gcp", "aws"} <= clouds


def test_plugins_load_without_their_heavy_runtimes(clean_env, first_party):
    """Core with no extras needs no torch_xla, boto3 or google libraries; every plugin module
    (and `aios plugins`/`aios devices`) imports with all heavy runtimes blocked."""
    code = (
        BLOCKER
        + """
from aios.plugins.registry import get_registry
reg = get_registry()
assert not reg.errors, [(e.plugin, e.error) for e in reg.errors]
print(sorted(reg.plugins))
from aios.cli.main import cli
for args in (["plugins"], ["devices"], ["config", "show"]):
    try:
        cli(args, standalone_mode=False)
    except SystemExit as e:
        assert e.code in (0, None), (args, e.code)
"""
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=clean_env, timeout=120
    )
    assert res.returncode == 0, res.stderr[-3000:]
    for dist in first_party:
        assert dist in res.stdout


# ------------------------------------------------------------------ no cloud code in core

NO_CLOUD = """
import sys
import aios, aios.runtime, aios.cli.run
assert aios.cli.run is not None
print("CLOUD=" + ",".join(sorted(m for m in sys.modules if m.split(".")[0] == "aios_cloud")))
"""


def test_core_imports_no_cloud_code(clean_env, root):
    """A training host needs no cloud code: importing aios, its runtime and aios-run pulls in
    nothing of aios_cloud (even with aios-cloud installed), and no core module imports it."""
    res = subprocess.run(
        [sys.executable, "-c", NO_CLOUD], capture_output=True, text=True, env=clean_env, timeout=120
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "CLOUD=\n" in res.stdout, res.stdout
    import ast

    for path in sorted((root / "packages" / "core" / "src").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not [n for n in names if n.split(".")[0] == "aios_cloud"], (path, names)


def test_core_wheel_ships_no_cloud_modules(root):
    from hatchling.builders.wheel import WheelBuilder

    files = [
        f.distribution_path
        for f in WheelBuilder(str(root / "packages" / "core")).recurse_included_files()
    ]
    assert "aios/cli/main.py" in files and "aios/runtime.py" in files
    cloud = [f for f in files if "cloud" in f.split("/")[-1] or "/cloud/" in f or "sshd" in f]
    assert cloud == [], cloud
    assert all(f.startswith(("aios/", "aios_core")) for f in files), files


def test_aios_help_lists_cloud_commands_without_importing_them(clean_env):
    """aios-cloud's commands reach `aios --help` through its plugin's specs; the control plane
    (aios_cloud.cli and the modules behind it) is imported only when a cloud command runs."""
    code = (
        "import sys; sys.argv = ['aios', '--help']\n"
        "from aios.cli.main import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('LOADED=' + ','.join(sorted(m for m in sys.modules if m.startswith('aios_cloud'))))\n"
        "print('TORCH=%d' % ('torch' in sys.modules))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=clean_env, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert "Commands from aios-cloud:" in res.stdout
    for name in ("launch", "status", "exec", "logs", "ssh", "sync", "stop", "start", "down"):
        assert f"\n  {name} " in res.stdout, name
    loaded = res.stdout.split("LOADED=")[1].split("\n")[0].split(",")
    assert "aios_cloud.plugin" in loaded and "aios_cloud.cli" not in loaded, loaded
    assert "aios_cloud.provider" not in loaded, loaded  # the control plane stays unloaded
    assert "TORCH=0" in res.stdout


def test_one_fact_one_place_cloud_catalogs_read_the_backends():
    """The cloud catalogs take hardware facts from the backends: TPU topology from backend-xla,
    Trainium chips from backend-neuron; the cloud side adds only prices, zones and regions."""
    from aios_backend_neuron.catalog import GIB, lookup
    from aios_backend_xla.topology import parse_accelerator_type
    from aios_cloud_aws import catalog as aws
    from aios_cloud_gcp.catalog import entry_for

    for acc in ("v4-16", "v5litepod-8", "v6e-4"):
        topo, entry = parse_accelerator_type(acc), entry_for(acc)
        assert (entry.devices, entry.hosts, entry.runtime) == (
            topo.chips,
            topo.hosts,
            topo.runtime_version,
        ), acc
    trn = [t for t in aws.INSTANCE_TYPES.values() if t.backend == "neuron"]
    assert {t.name.split(".")[0] for t in trn} >= {"trn1", "trn2"}
    for t in trn:
        chip = lookup(t.name)
        assert (t.accelerators, t.accelerator_memory_gib, t.efa_interfaces) == (
            chip.devices,
            chip.memory_per_device // GIB,
            chip.efa_interfaces,
        ), t.name
