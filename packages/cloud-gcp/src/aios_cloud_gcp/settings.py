"""The ``gcp`` config section (``AIOS_GCP__PROJECT=...``, ``gcp.zone=...``, YAML ``gcp:``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from aios.config import Section


class GcpSettings(Section):
    project: str | None = Field(None, description="GCP project (else GOOGLE_CLOUD_PROJECT, CLOUDSDK_CORE_PROJECT, gcloud config)")
    zone: str | None = Field(None, description="default zone to try first")
    endpoint: str | None = Field(None, description="Cloud TPU API endpoint (default tpu.googleapis.com); tests point it at a local service")
    credentials: Literal["auto", "adc", "gcloud", "anonymous"] = Field(
        "auto", description="auto: Application Default Credentials, then `gcloud auth print-access-token`")
    ssh_user: str = Field("aios", description="login user created on the TPU VMs through the ssh-keys metadata")
    use_internal_ip: bool = Field(False, description="SSH to internal IPs (when running inside the VPC)")
    network: str | None = None
    subnetwork: str | None = None
    service_account: str | None = None
    poll_interval: float = Field(5.0, gt=0, description="seconds between operation polls")
    create_timeout: float = Field(1800.0, gt=0, description="seconds to wait for a node or queued resource")
    zones: dict[str, list[str]] = Field(default_factory=dict, description="override zones per generation: {v5e: [us-west4-a, ...]}")
    prices: dict[str, list[float]] = Field(default_factory=dict, description="override USD per chip-hour per generation: {v5e: [on_demand, spot]}")
    torch_version: str = Field("2.9.0", description="torch / torch_xla pinned by setup on the hosts")
    aios_requirements: list[str] = Field(default_factory=list, description="extra pip requirements setup installs on every host (aios itself is shipped with the code)")
