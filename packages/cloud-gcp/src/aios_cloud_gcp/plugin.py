"""The ``aios-cloud-gcp`` plugin (entry point). Imports nothing from google at module level."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from aios.plugins.hookspecs import hookimpl
from aios.types import CloudSpec, DoctorCheck, Lazy, StorageSpec

from aios_cloud_gcp.storage import storage_options


@hookimpl
def aios_register_clouds(register: Any) -> None:
    register(
        CloudSpec(
            name="gcp",
            factory=Lazy("aios_cloud_gcp.provider:GcpProvider"),
            description="Google Cloud TPU VMs and pod slices (Cloud TPU API v2)",
            install_hint="pip install -e './packages/core[gcp]' ./packages/cloud "
            "./packages/backend-xla ./packages/cloud-gcp (from the aios checkout)",
        )
    )


@hookimpl
def aios_register_storage(register: Any) -> None:
    # gcsfs reads GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT once, when it is first imported; an emulator
    # speaks only the classic JSON API, so the switch must be set before anything imports gcsfs
    # (storage_options runs too late when a doctor check or fsspec already imported it).
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    register(
        StorageSpec(
            scheme="gs",
            protocol="gs",
            requires="gcsfs",
            install_hint="pip install gcsfs",
            storage_options=storage_options,
        )
    )


@hookimpl
def aios_config_sections() -> dict[str, type]:
    from aios_cloud_gcp.settings import GcpSettings  # deferred: imports pydantic

    return {"gcp": GcpSettings}


@hookimpl
def aios_preemption_watchers(config: Any) -> list[Any] | None:
    from aios_cloud_gcp.preemption import (  # deferred: plugin entry, loaded at `aios --help`
        GcePreemptionWatcher,
        TpuMaintenanceWatcher,
        on_gce,
        on_tpu_vm,
    )

    if not on_gce():
        return None
    # every TPU VM host also watches Cloud TPU's upcoming-maintenance key
    return [GcePreemptionWatcher(), *([TpuMaintenanceWatcher()] if on_tpu_vm() else [])]


@hookimpl
def aios_doctor_checks(backend: str | None, config: Any) -> list[DoctorCheck] | None:
    if backend not in (None, "xla"):
        return None
    out = []
    for mod, dist in (("google.cloud.tpu_v2", "google-cloud-tpu"), ("gcsfs", "gcsfs")):
        try:
            found = importlib.util.find_spec(mod) is not None
        except ModuleNotFoundError:
            found = False
        out.append(
            DoctorCheck(
                f"{dist} installed",
                "pass" if found else "fail",
                f"{dist} {'found' if found else 'missing'}",
                "" if found else f"pip install {dist}",
                backend=None,
            )
        )
    project = (
        config.section("gcp").project
        if config is not None and config.section("gcp") is not None
        else None
    ) or os.environ.get("GOOGLE_CLOUD_PROJECT")
    out.append(
        DoctorCheck(
            "gcp project",
            "pass" if project else "warn",
            f"project {project}" if project else "no GCP project configured",
            ""
            if project
            else "set gcp.project or GOOGLE_CLOUD_PROJECT (needed by aios launch --cloud gcp)",
        )
    )
    return out


@hookimpl
def aios_env_info() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, Any] = {}
    for dist in ("aios-cloud-gcp", "google-cloud-tpu", "gcsfs"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "not installed"
    out["GOOGLE_CLOUD_PROJECT"] = os.environ.get("GOOGLE_CLOUD_PROJECT", "")
    return out
