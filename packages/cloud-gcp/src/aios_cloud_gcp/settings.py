"""The ``gcp`` config section (``AIOS_GCP__PROJECT=...``, ``gcp.zone=...``, YAML ``gcp:``)."""

from __future__ import annotations

from typing import Literal

from aios.config.settings import Section
from aios_cloud.provider.requirements import registry_aios
from pydantic import Field, field_validator


class GcpSettings(Section):
    project: str | None = Field(
        None,
        description="GCP project (else GOOGLE_CLOUD_PROJECT, CLOUDSDK_CORE_PROJECT, gcloud config)",
    )
    zone: str | None = Field(None, description="default zone to try first")
    endpoint: str | None = Field(
        None,
        description="Cloud TPU API endpoint (default tpu.googleapis.com); tests point it at a local service",
    )
    credentials: Literal["auto", "adc", "gcloud", "anonymous"] = Field(
        "auto",
        description="auto: Application Default Credentials, then `gcloud auth print-access-token`",
    )
    ssh_user: str = Field(
        "aios", description="login user created on the TPU VMs through the ssh-keys metadata"
    )
    agent_endpoint: str | None = Field(
        None,
        description="Cloud TPU API endpoint as the hosts reach it, for the autostop agent (default: endpoint)",
    )
    os_login: bool = Field(
        False,
        description="the project/org enforces OS Login: aios imports its key into your OS Login profile "
        "and logs in as its POSIX user (ssh-keys metadata is ignored there)",
    )
    os_login_user: str | None = Field(
        None,
        description="the account (email) whose OS Login profile gets the key; default: the credentials' "
        "service account",
    )
    os_login_endpoint: str = Field(
        "https://oslogin.googleapis.com",
        description="OS Login API endpoint (tests point it at a local service)",
    )
    use_internal_ip: bool = Field(
        False, description="SSH to internal IPs (when running inside the VPC)"
    )
    network: str | None = None
    subnetwork: str | None = None
    service_account: str | None = None
    poll_interval: float = Field(5.0, gt=0, description="seconds between operation polls")
    create_timeout: float = Field(
        1800.0, gt=0, description="seconds to wait for a node to be created"
    )
    queue_timeout: float = Field(
        7 * 86400.0, gt=0, description="seconds to wait for a queued resource without --valid-until"
    )
    queue_grace: float = Field(
        600.0,
        ge=0,
        description="seconds past --valid-until before aios stops waiting (the API marks it FAILED)",
    )
    zones: dict[str, list[str]] = Field(
        default_factory=dict, description="override zones per generation: {v5e: [us-west4-a, ...]}"
    )
    prices: dict[str, list[float]] = Field(
        default_factory=dict,
        description="override USD per chip-hour per generation: {v5e: [on_demand, spot]}",
    )
    torch_version: str = Field(
        "2.9.0", description="torch / torch_xla pinned by setup on the hosts"
    )
    aios_requirements: list[str] = Field(
        default_factory=list,
        description="extra pip requirements setup installs on every host (aios itself is shipped with the code)",
    )

    @field_validator("aios_requirements")
    @classmethod
    def _no_registry_aios(cls, v: list[str]) -> list[str]:
        bad = [r for r in v if registry_aios(r)]
        if bad:
            raise ValueError(
                f"'{bad[0]}' would come from the package registry, where that name belongs to an unrelated project; "
                "aios is shipped to the hosts with the synced code"
            )
        return v
