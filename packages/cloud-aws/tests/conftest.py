"""Fixtures: one moto server per session (real boto3 over HTTP on 127.0.0.1), an EC2 proxy in
front of it for injected errors and placement groups, the DLAMI SSM parameters seeded."""

from __future__ import annotations

import pytest
from aios_cloud_aws.settings import AwsSettings


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
    ``gpu_ami``, ``neuron_ami`` (Trn1's image), ``trn2_ami``, ``images`` (name -> id)."""
    import types

    import boto3
    from aios_cloud_aws.testing.moto import aws_env, publish_dlamis

    moto_server.reset()
    ec2_proxy.clear()
    with aws_env(moto_server.endpoint, ec2_proxy.endpoint) as env:
        ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=moto_server.endpoint)
        # the DLAMIs as AWS publishes them (Amazon-owned, some behind SSM parameters)
        images = publish_dlamis()

        def publish(region: str) -> None:  # another region's images, for the tests that need them
            images.update({f"{region}:{n}": i for n, i in publish_dlamis(region).items()})

        gpu = images["Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.11 (Ubuntu 24.04) 20261009"]
        neuron = images["Deep Learning AMI Neuron PyTorch 2.9 (Ubuntu 24.04) 20260612"]
        trn2 = images["Deep Learning AMI Neuron torch-neuronx 2.14.0 (Ubuntu 24.04) 20261020"]
        yield types.SimpleNamespace(
            proxy=ec2_proxy,
            endpoint=moto_server.endpoint,
            ec2=ec2,
            gpu_ami=gpu,
            neuron_ami=neuron,
            trn2_ami=trn2,
            images=images,
            publish=publish,
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
