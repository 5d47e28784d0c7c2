"""Ship aios itself to the hosts: the installed aios-core and every loaded aios plugin, as
source packages plus minimal dist-info (so entry points are discovered there exactly as here).

The bundle lands in ``~/aios/<cluster>/code/.aios-site`` and is put first on ``PYTHONPATH`` of
every job, so the hosts run the very aios version that launched them (no PyPI lookup: the
``aios-core`` name on PyPI belongs to an unrelated project). Their third-party requirements
(pluggy, click, pydantic, ...) are installed by the setup step.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path

from aios.plugins.registry import get_registry

SITE = ".aios-site"
_SKIP_DIRS = {"__pycache__", "tests"}


@dataclass
class Bundle:
    files: list[tuple[Path, str]] = field(default_factory=list)  # (source, arcname)
    generated: dict[str, str] = field(default_factory=dict)  # arcname -> text
    requirements: list[str] = field(default_factory=list)
    dists: list[str] = field(default_factory=list)


def _top_package(module: str) -> Path | None:
    top = module.split(".")[0]
    spec = importlib.util.find_spec(top)
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return Path(spec.origin) if spec.origin else None


def build(backend: str | None = None, cloud: str | None = None) -> Bundle:
    """The bundle: aios-core plus the loaded plugins the hosts need: the one that registers
    ``backend``, the one that registers ``cloud`` (its storage scheme serves the checkpoints),
    and plugins that register neither a backend nor a cloud (loggers, storage)."""
    from importlib.metadata import PackageNotFoundError, distribution

    reg = get_registry()
    wanted = {"aios-core": "aios"}
    for name, info in reg.plugins.items():
        backends = {b for b, s in reg.backends.items() if s.plugin == name}
        clouds = {c for c, s in reg.clouds.items() if s.plugin == name}
        if (
            (backend is None and cloud is None)
            or (not backends and not clouds)
            or backend in backends
            or cloud in clouds
        ):
            wanted[name] = info.module
    # the plugins the wanted ones depend on (aios-cloud-gcp -> aios-cloud: the agent and
    # `aios sync` run aios_cloud on the hosts), except a plugin of another backend than the
    # job's (aios-cloud-gcp -> aios-backend-xla for a cpu job)
    for dist_name in list(wanted):
        try:
            requires = distribution(dist_name).requires or []
        except PackageNotFoundError:
            continue
        for r in requires:
            dep = re.split(r"[\s;<>=!~\[(]", r, maxsplit=1)[0].lower().replace("_", "-")
            if "extra ==" in r or dep not in reg.plugins:
                continue
            serves = {b for b, s in reg.backends.items() if s.plugin == dep}
            if backend is not None and serves and backend not in serves:
                continue
            wanted.setdefault(dep, reg.plugins[dep].module)
    out = Bundle()
    reqs: set[str] = set()
    for dist_name, module in sorted(wanted.items()):
        try:
            dist = distribution(dist_name)
        except PackageNotFoundError:
            continue
        root = _top_package(module)
        if root is None:
            continue
        if root.is_dir():
            for p in sorted(root.rglob("*")):
                rel = p.relative_to(root.parent)
                if (
                    p.is_file()
                    and not (set(rel.parts) & _SKIP_DIRS)
                    and p.suffix not in (".pyc", ".so")
                ):
                    out.files.append((p, f"{SITE}/{rel.as_posix()}"))
        else:
            out.files.append((root, f"{SITE}/{root.name}"))
        norm = re.sub(r"[-_.]+", "_", dist_name)
        dist_info = f"{SITE}/{norm}-{dist.version}.dist-info"
        out.generated[f"{dist_info}/METADATA"] = (
            f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: {dist.version}\n"
        )
        eps = dist.read_text("entry_points.txt")
        if eps:
            out.generated[f"{dist_info}/entry_points.txt"] = eps
        for r in dist.requires or []:
            if "extra ==" in r:
                continue
            name = re.split(r"[\s;<>=!~\[]", r, maxsplit=1)[0]
            if not name.lower().startswith("aios-") and name.lower() not in (
                "torch",
                "torch-xla",
                "torch_xla",
            ):
                reqs.add(r.split(";")[0].strip())
        out.dists.append(f"{dist_name}=={dist.version}")
    out.requirements = sorted(reqs)
    return out
