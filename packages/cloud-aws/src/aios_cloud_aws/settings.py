"""The ``aws`` config section (``aws.region=us-west-2``, ``AIOS_AWS__REGION``, YAML ``aws:``).

No field holds a secret: credentials come from boto3's own chain (env, profile, SSO, instance
role) and are never copied into configs, records or the hosts.
"""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import Field

from aios.config import Section

# Public SSM parameters of the AWS Deep Learning AMIs. AWS renames them between releases (the
# PyTorch version and OS are part of the name), hence configurable.
GPU_AMI_PARAMETER = "/aws/service/deeplearning/ami/x86_64/oss-nvidia-driver-gpu-pytorch-2.7-ubuntu-22.04/latest/ami-id"
NEURON_AMI_PARAMETER = "/aws/service/neuron/dlami/multi-framework/ubuntu-22.04/latest/image_id"


class AwsSettings(Section):
    region: str = Field("us-east-1", description="region to launch in (--region overrides)")
    profile: Optional[str] = Field(None, description="AWS profile name (credentials stay in ~/.aws)")
    zones: list[str] = Field(default_factory=list, description="availability zones to try, in order; empty: every zone offering the type")
    ami: Optional[str] = Field(None, description="AMI id to use instead of the Deep Learning AMI")
    gpu_ami_parameter: str = Field(GPU_AMI_PARAMETER, description="SSM parameter holding the GPU PyTorch DLAMI id")
    neuron_ami_parameter: str = Field(NEURON_AMI_PARAMETER, description="SSM parameter holding the Neuron DLAMI id")
    ssh_user: str = Field("ubuntu", description="login user of the AMI")
    key_name: Optional[str] = Field(None, description="existing EC2 key pair to reuse; default: aios imports its own public key per cluster")
    ssh_private_key: Optional[str] = Field(None, description="private key path matching key_name (a path, never the key)")
    security_group_ids: list[str] = Field(default_factory=list, description="existing security groups to reuse; default: one created per cluster")
    subnet_ids: list[str] = Field(default_factory=list, description="subnets to launch in (one per zone); default: the default VPC")
    ssh_cidr: str = Field("0.0.0.0/0", description="source CIDR allowed to SSH into the hosts")
    use_private_ip: bool = Field(False, description="connect over private IPs (from inside the VPC, a VPN or a bastion)")
    efa: Literal["auto", "on", "off"] = Field("auto", description="EFA interfaces: auto = on for multi-node EFA-capable types")
    efa_secondary_type: Literal["efa", "efa-only"] = Field("efa-only", description="interface type of the EFA cards after the first")
    placement_group: Union[bool, Literal["auto"]] = Field("auto", description="cluster placement group: auto = multi-node EFA launches")
    disk_gb: int = Field(512, ge=8, description="root EBS volume size (gp3)")
    spot_max_price: Optional[float] = Field(None, gt=0, description="spot price cap in USD/h; default: the on-demand price")
    iam_instance_profile: Optional[str] = Field(None, description="instance profile the hosts use for S3 (never copied keys)")
    aios_requirements: list[str] = Field(default_factory=lambda: ["aios-core[aws]"], description="how setup installs aios on the hosts (DLAMI python)")
    python: Optional[str] = Field(None, description="python on the hosts; default: the DLAMI's PyTorch environment")
    spot_watch: Union[bool, Literal["auto"]] = Field("auto", description="poll the EC2 spot interruption notice in training processes; auto: on EC2 instances")
    imds_poll_seconds: float = Field(5.0, gt=0, description="spot interruption notice poll interval on each host")
    launch_timeout: float = Field(900.0, gt=0, description="seconds to wait for instances to reach running")
    max_attempts: int = Field(4, ge=1, le=20, description="botocore attempts per API call, the first included (standard retry mode)")


# Set by the provider on spot hosts (a reserved AIOS_RUN_* name, never a config key): with
# aws.spot_watch=auto the training processes poll the spot notice even where on_ec2() cannot tell.
from aios.contract import SPOT_WATCH_ENV  # noqa: E402,F401 - re-exported

DLAMI_PYTHON = {
    "cuda": "/opt/pytorch/bin/python3",
    "neuron": "/opt/aws_neuronx_venv_pytorch_2_8/bin/python3",
}


def settings_from(config: object | None) -> AwsSettings:
    """The ``aws`` section of a resolved config, or the defaults."""
    section = getattr(config, "aws", None) if config is not None else None
    if isinstance(section, AwsSettings):
        return section
    if section is not None and hasattr(section, "model_dump"):
        return AwsSettings.model_validate(section.model_dump())
    return AwsSettings()
