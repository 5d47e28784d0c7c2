"""Fixtures: one moto server per session (real boto3 over HTTP on 127.0.0.1), an EC2 proxy in
front of it for injected errors and placement groups, the DLAMI SSM parameters seeded."""

from __future__ import annotations

import pytest
from aios_cloud_aws.settings import GPU_AMI_PARAMETER, AwsSettings, neuron_ami_parameter


@pytest.fixture(scope="session")
def moto_server():
    pytest.importorskip(
        "moto.server",
        reason="needs moto[server]: pip install -e ./packages/core ./packages/cloud "
        "'./packages/cloud-aws[test]' from the aios checkout",
    )
    from aios_cloud_aws.testing.moto import MotoServer

    with MotoServer() as server:
        yield server


@pytest.fixture(scope="session")
def ec2_proxy(moto_server):
    from aios_cloud_aws.testing.ec2proxy import Ec2Proxy

    with Ec2Proxy(moto_server.endpoint) as proxy:
        yield proxy


@pytest.fixture
def aws(moto_server, ec2_proxy):
    """A clean moto + proxy, the process env pointing at them, DLAMI parameters published.
    Yields a namespace with ``proxy``, ``endpoint``, ``ec2`` (a boto3 client straight to moto),
    ``gpu_ami``, ``neuron_ami``."""
    import types

    import boto3
    from aios_cloud_aws.testing.moto import aws_env, seed_public_parameter

    moto_server.reset()
    ec2_proxy.clear()
    with aws_env(moto_server.endpoint, ec2_proxy.endpoint) as env:
        ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=moto_server.endpoint)
        gpu = ec2.register_image(
            Name="Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.7 (Ubuntu 22.04)",
            RootDeviceName="/dev/sda1",
        )["ImageId"]
        neuron = ec2.register_image(
            Name="Deep Learning AMI Neuron (Ubuntu 24.04)", RootDeviceName="/dev/sda1"
        )["ImageId"]
        seed_public_parameter(GPU_AMI_PARAMETER, gpu)
        # the Neuron DLAMI parameters of aios.versions: Trn1 (neuron-xla) and Trn2/Trn3 (neuron)
        for itype in ("trn1.32xlarge", "trn2.48xlarge"):
            seed_public_parameter(neuron_ami_parameter(itype), neuron)
        yield types.SimpleNamespace(
            proxy=ec2_proxy,
            endpoint=moto_server.endpoint,
            ec2=ec2,
            gpu_ami=gpu,
            neuron_ami=neuron,
            env=env,
            server=moto_server,
        )


@pytest.fixture
def make_provider(aws):
    from aios_cloud_aws.provider import AwsProvider

    made = []

    def make(**settings):
        settings.setdefault("max_attempts", 2)
        p = AwsProvider(settings=AwsSettings(**settings), poll_interval=0.02)
        made.append(p)
        return p

    yield make


@pytest.fixture
def pubkey(tmp_path):
    import subprocess

    key = tmp_path / "id_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key), "-C", "aios-test"],
        check=True,
    )
    return key.with_suffix(".pub").read_text()
