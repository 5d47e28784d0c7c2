"""The ``aios-cloud-aws`` plugin (entry point ``aios-cloud-aws = "aios_cloud_aws.plugin"``).

Hooks: :func:`aios_register_clouds` (``aws``), :func:`aios_register_storage` (``s3``),
:func:`aios_config_sections` (``aws``), :func:`aios_preemption_watchers` (EC2 spot notice),
:func:`aios_doctor_checks`, :func:`aios_env_info`. Importing this module imports neither boto3
nor pydantic models nor torch.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from aios.plugins.hookspecs import hookimpl
from aios.types import CloudSpec, DoctorCheck, Lazy, StorageSpec

from aios_cloud_aws.storage import storage_options

INSTALL = "pip install -e './packages/core[aws]' ./packages/cloud ./packages/cloud-aws (from the aios checkout)"


@hookimpl
def aios_register_clouds(register: Any) -> None:
    register(
        CloudSpec(
            name="aws",
            factory=Lazy("aios_cloud_aws.provider:AwsProvider"),
            install_hint=INSTALL,
            description="AWS EC2: P4d/P5/P5e GPUs, Trn1/Trn2 Trainium; spot with recovery; S3",
        )
    )


@hookimpl
def aios_register_storage(register: Any) -> None:
    register(
        StorageSpec(
            scheme="s3",
            protocol="s3",
            requires="s3fs",
            install_hint="pip install -e './packages/core[aws]' ./packages/cloud "
            "./packages/cloud-aws (from the aios checkout; brings s3fs)",
            storage_options=storage_options,
        )
    )


@hookimpl
def aios_config_sections() -> dict[str, type]:
    from aios_cloud_aws.settings import AwsSettings  # deferred: imports pydantic

    return {"aws": AwsSettings}


@hookimpl
def aios_preemption_watchers(config: Any) -> list[Any] | None:
    import os

    from aios_cloud_aws.settings import SPOT_WATCH_ENV, settings_from  # deferred: imports pydantic

    settings = settings_from(config)
    watch = settings.spot_watch
    if watch == "auto":
        from aios_cloud_aws.imds import on_ec2  # deferred: plugin entry, loaded at `aios --help`

        watch = os.environ.get(SPOT_WATCH_ENV) == "1" or on_ec2()
    if not watch:
        return None
    from aios_cloud_aws.imds import (
        SpotInterruptionWatcher,
    )  # deferred: plugin entry, loaded at `aios --help`

    return [SpotInterruptionWatcher(interval=settings.imds_poll_seconds)]


@hookimpl
def aios_doctor_checks(backend: str | None, config: Any) -> list[DoctorCheck] | None:
    if backend not in (None, "cuda", "neuron"):
        return None
    checks = []
    for mod, what in (("boto3", "boto3 (EC2 provisioning)"), ("s3fs", "s3fs (s3:// checkpoints)")):
        ok = importlib.util.find_spec(mod) is not None
        checks.append(
            DoctorCheck(
                f"aws: {what}",
                "pass" if ok else "warn",
                "installed" if ok else "not installed",
                ""
                if ok
                else (
                    INSTALL
                    if mod == "boto3"
                    else "pip install -e './packages/core[aws]' ./packages/cloud "
                    "./packages/cloud-aws (from the aios checkout)"
                ),
            )
        )
    if importlib.util.find_spec("boto3") is not None:
        try:
            from aios_cloud_aws.session import Clients  # deferred: imports pydantic
            from aios_cloud_aws.settings import settings_from  # deferred: imports pydantic

            source = Clients(settings_from(config)).credentials_source()
            checks.append(DoctorCheck("aws: credentials", "pass", source))
        except Exception as exc:  # noqa: BLE001 - reported as a check
            checks.append(
                DoctorCheck(
                    "aws: credentials",
                    "warn",
                    getattr(exc, "message", str(exc)),
                    getattr(exc, "fix", ""),
                )
            )
    return checks


@hookimpl
def aios_env_info() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, Any] = {}
    for dist in ("aios-cloud-aws", "boto3", "botocore", "s3fs"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "not installed"
    return out
