"""The ``aws`` config section (``aws.region=us-west-2``, ``AIOS_AWS__REGION``, YAML ``aws:``).

No field holds a secret: credentials come from boto3's own chain (env, profile, SSO, instance
role) and are never copied into configs, records or the hosts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from aios.config.settings import Section
from aios.plugins.versions import STACKS
from aios_cloud.provider.requirements import registry_aios
from pydantic import Field, field_validator

# Public SSM parameters of the AWS Deep Learning AMIs. AWS renames them between releases (the
# PyTorch version and OS are part of the name), hence configurable. The default is a PyTorch
# DLAMI in patch support (https://docs.aws.amazon.com/dlami/latest/devguide/support-policy.html:
# the PyTorch 2.7 images left it on 2026-04-23); PyTorch 2.11 on Ubuntu 24.04, python at
# /opt/pytorch/bin/python3 (its release notes, 2026-10: python_location /opt/pytorch/bin/python).
GPU_AMI_PARAMETER = "/aws/service/deeplearning/ami/x86_64/oss-nvidia-driver-gpu-pytorch-2.11-ubuntu-24.04/latest/ami-id"


def neuron_image(instance_type: str) -> Mapping[str, str]:
    """What the Neuron DLAMI for ``instance_type`` ships (SSM parameter, venv, python, OS), from
    the version set of its hardware in :data:`aios.plugins.versions.STACKS` (one fact, one place): Trn1
    -> ``neuron-xla`` (Neuron 2.29, PyTorch 2.9 DLAMI), Trn2/Trn3 -> ``neuron`` (TorchNeuron)."""
    family = instance_type.split(".", 1)[0].lower()
    for stack in ("neuron", "neuron-xla"):
        for vs in STACKS[stack]:
            if family in vs.hardware:
                return vs.image
    return STACKS["neuron"][0].image


def neuron_ami_parameter(instance_type: str) -> str:
    """The public SSM parameter holding the Neuron DLAMI id for ``instance_type``."""
    image = neuron_image(instance_type)
    return image.get("ssm_parameter") or image["ssm_parameter_base"]


class AwsSettings(Section):
    region: str = Field("us-east-1", description="region to launch in (--region overrides)")
    profile: str | None = Field(None, description="AWS profile name (credentials stay in ~/.aws)")
    zones: list[str] = Field(
        default_factory=list,
        description="availability zones to try, in order; empty: every zone offering the type",
    )
    ami: str | None = Field(None, description="AMI id to use instead of the Deep Learning AMI")
    gpu_ami_parameter: str = Field(
        GPU_AMI_PARAMETER, description="SSM parameter holding the GPU PyTorch DLAMI id"
    )
    neuron_ami_parameter: str | None = Field(
        None,
        description="SSM parameter holding the Neuron DLAMI id; default: the newest Amazon "
        "image named as the instance's Neuron version set in aios.plugins.versions.STACKS says (Trn1: "
        "the PyTorch 2.9 Neuron DLAMI, Trn2/Trn3: the torch-neuronx 2.14.0 DLAMI, Ubuntu 24.04)",
    )
    ssh_user: str = Field("ubuntu", description="login user of the AMI")
    key_name: str | None = Field(
        None,
        description="existing EC2 key pair to reuse; default: aios imports its own public key per cluster",
    )
    ssh_private_key: str | None = Field(
        None, description="private key path matching key_name (a path, never the key)"
    )
    security_group_ids: list[str] = Field(
        default_factory=list,
        description="existing security groups to reuse; default: one created per cluster",
    )
    subnet_ids: list[str] = Field(
        default_factory=list,
        description="subnets to launch in (one per zone); default: the default VPC",
    )
    ssh_cidr: str = Field("0.0.0.0/0", description="source CIDR allowed to SSH into the hosts")
    use_private_ip: bool = Field(
        False, description="connect over private IPs (from inside the VPC, a VPN or a bastion)"
    )
    efa: Literal["auto", "on", "off"] = Field(
        "auto", description="EFA interfaces: auto = on for multi-node EFA-capable types"
    )
    efa_secondary_type: Literal["efa", "efa-only"] = Field(
        "efa-only",
        description="interface type of the EFA interfaces (the primary interface is ENA, as the AWS guide says)",
    )
    placement_group: bool | Literal["auto"] = Field(
        "auto", description="cluster placement group: auto = multi-node EFA launches"
    )
    disk_gb: int = Field(512, ge=8, description="root EBS volume size (gp3)")
    capacity_block_margin: float = Field(
        300.0,
        ge=0,
        description="seconds before a Capacity Block's reclaim (its end minus 30 minutes) by "
        "which the run's emergency checkpoint must be committed",
    )
    spot_max_price: float | None = Field(
        None, gt=0, description="spot price cap in USD/h; default: the on-demand price"
    )
    iam_instance_profile: str | None = Field(
        None,
        description="instance profile the hosts use for S3 (never copied keys); required for s3:// checkpoints",
    )
    efa_check: bool = Field(
        True,
        description="before a multi-node EFA job, verify on every host that libfabric's EFA provider is "
        "usable (fi_info -p efa)",
    )
    aios_requirements: list[str] = Field(
        default_factory=list,
        description="extra pip requirements setup installs on every host (aios itself is shipped with the "
        "code, never from the registry)",
    )
    python: str | None = Field(
        None, description="python on the hosts; default: the DLAMI's PyTorch environment"
    )
    spot_watch: bool | Literal["auto"] = Field(
        "auto",
        description="poll the EC2 spot interruption notice in training processes; auto: on EC2 instances",
    )
    imds_poll_seconds: float = Field(
        5.0, gt=0, description="spot interruption notice poll interval on each host"
    )
    launch_timeout: float = Field(
        900.0, gt=0, description="seconds to wait for instances to reach running"
    )
    max_attempts: int = Field(
        4,
        ge=1,
        le=20,
        description="botocore attempts per API call, the first included (standard retry mode)",
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


# Set by the provider on spot hosts (a reserved AIOS_RUN_* name, never a config key): with
# aws.spot_watch=auto the training processes poll the spot notice even where on_ec2() cannot tell.
from aios.launcher.contract import SPOT_WATCH_ENV  # noqa: E402,F401 - re-exported

# The DLAMI's python for CUDA; a Neuron DLAMI's venv python comes from aios.plugins.versions
# (:func:`neuron_image`).
DLAMI_PYTHON = {"cuda": "/opt/pytorch/bin/python3"}


def settings_from(config: object | None) -> AwsSettings:
    """The ``aws`` section of a resolved config, or the defaults."""
    section = getattr(config, "aws", None) if config is not None else None
    if isinstance(section, AwsSettings):
        return section
    if section is not None and hasattr(section, "model_dump"):
        return AwsSettings.model_validate(section.model_dump())
    return AwsSettings()
