"""The ``aios-cloud-k8s`` plugin (entry point). Imports nothing heavy (no kubernetes client)."""

from __future__ import annotations

import importlib.util
from typing import Any

from aios.plugins.hookspecs import hookimpl
from aios.types import CloudSpec, DoctorCheck, Lazy


@hookimpl
def aios_register_clouds(register: Any) -> None:
    register(
        CloudSpec(
            name="k8s",
            factory=Lazy("aios_cloud_k8s.provider:K8sProvider"),
            description="Kubernetes: JobSets (GKE TPU slices, EKS) and indexed Jobs",
            install_hint="pip install -e ./packages/cloud ./packages/cloud-k8s",
        )
    )


@hookimpl
def aios_config_sections() -> dict[str, type]:
    from aios_cloud_k8s.settings import K8sSettings  # deferred: imports pydantic

    return {"k8s": K8sSettings}


@hookimpl
def aios_doctor_checks(backend: str | None, config: Any) -> list[DoctorCheck] | None:
    if backend is not None:
        return None
    found = importlib.util.find_spec("kubernetes") is not None
    return [
        DoctorCheck(
            "kubernetes client",
            "pass" if found else "warn",
            f"kubernetes {'found' if found else 'missing'}",
            "" if found else "pip install kubernetes (aios launch --cloud k8s)",
        )
    ]
