"""The ``aios-cloud-slurm`` plugin (entry point). Imports nothing heavy."""

from __future__ import annotations

import shutil
from typing import Any

from aios.plugins.hookspecs import hookimpl
from aios.types import CloudSpec, DoctorCheck, Lazy


@hookimpl
def aios_register_clouds(register: Any) -> None:
    register(
        CloudSpec(
            name="slurm",
            factory=Lazy("aios_cloud_slurm.provider:SlurmProvider"),
            description="Slurm clusters (sbatch, locally or on a login node over ssh)",
            install_hint="pip install -e ./packages/cloud ./packages/cloud-slurm",
        )
    )


@hookimpl
def aios_config_sections() -> dict[str, type]:
    from aios_cloud_slurm.settings import SlurmSettings  # deferred: imports pydantic

    return {"slurm": SlurmSettings}


@hookimpl
def aios_doctor_checks(backend: str | None, config: Any) -> list[DoctorCheck] | None:
    if backend is not None:
        return None
    section = config.section("slurm") if config is not None else None
    if section is not None and section.login:
        return [
            DoctorCheck(
                "slurm login node", "pass", f"jobs are submitted on {section.login} over ssh", ""
            )
        ]
    found = shutil.which("sbatch")
    return [
        DoctorCheck(
            "slurm sbatch",
            "pass" if found else "warn",
            f"sbatch {'found at ' + found if found else 'not on PATH'}",
            ""
            if found
            else "install the Slurm client tools, or set slurm.login to a login node (aios launch --cloud slurm)",
        )
    ]
