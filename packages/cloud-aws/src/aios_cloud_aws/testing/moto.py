"""A moto server for tests: the real boto3/s3fs talk HTTP to it on 127.0.0.1.

``ThreadedMotoServer`` runs in this process, so state moto cannot receive through the AWS API
(the reserved ``/aws/service/...`` SSM parameters AWS publishes) is seeded into its backend the
way moto seeds its own public parameters.
"""

from __future__ import annotations

import contextlib
import os
import urllib.request
from collections.abc import Iterator
from typing import Any

ACCOUNT = "123456789012"
FAKE_KEY_ID = "AKIAAIOSTESTKEY00000"
FAKE_SECRET = "aios-test-secret-never-written-0123456789"


class MotoServer:
    """Start with :meth:`start`; ``endpoint`` is ``http://127.0.0.1:PORT``."""

    def __init__(self) -> None:
        self._server: Any = None
        self.endpoint = ""

    def start(self) -> MotoServer:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        import logging

        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def reset(self) -> None:
        """Forget every resource (moto's reset API)."""
        req = urllib.request.Request(self.endpoint + "/moto-api/reset", method="POST", data=b"")
        urllib.request.urlopen(req, timeout=60).read()  # slow on a loaded machine

    def __enter__(self) -> MotoServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def seed_public_parameter(
    name: str, value: str, region: str = "us-east-1", data_type: str = "aws:ec2:image"
) -> None:
    """Publish ``name`` (an ``/aws/service/...`` parameter) in moto's SSM, as AWS does for the
    Deep Learning AMIs. Reads then go through the real ``ssm:GetParameter`` API."""
    import datetime

    from moto.ssm.models import Parameter, ssm_backends

    params = ssm_backends[ACCOUNT][region]._parameters
    versions = params[name]
    versions.append(
        # moto's Parameter is concrete at runtime; its CloudFormation base declares the two
        # members abstract in its type stubs only
        Parameter(  # type: ignore[abstract]
            account_id=ACCOUNT,
            name=name,
            value=value,
            parameter_type="String",
            description=None,
            allowed_pattern=None,
            keyid=None,
            last_modified_date=datetime.datetime.now(datetime.timezone.utc),
            version=len(versions) + 1,
            data_type=data_type,
        )
    )


@contextlib.contextmanager
def aws_env(
    endpoint: str, ec2_endpoint: str | None = None, region: str = "us-east-1", **extra: str
) -> Iterator[dict[str, str]]:
    """Environment pointing boto3 (and s3fs) at the moto server with throwaway credentials; the
    previous environment is restored afterwards."""
    env = {
        "AWS_ACCESS_KEY_ID": FAKE_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": FAKE_SECRET,
        "AWS_DEFAULT_REGION": region,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aios-test-credentials",
        "AWS_CONFIG_FILE": "/nonexistent/aios-test-config",
        **({"AWS_ENDPOINT_URL_EC2": ec2_endpoint} if ec2_endpoint else {}),
        **extra,
    }
    saved = {k: os.environ.get(k) for k in [*env, "AWS_SESSION_TOKEN", "AWS_PROFILE"]}
    os.environ.pop("AWS_SESSION_TOKEN", None)
    os.environ.pop("AWS_PROFILE", None)
    os.environ.update(env)
    try:
        yield env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def reclaim_spot(instance_ids: list[str], region: str = "us-east-1") -> None:
    """Do what EC2 does two minutes after a spot interruption notice: terminate the instances
    with state reason ``Server.SpotInstanceTermination`` (no API exists for this; moto's backend
    is driven directly, as AWS drives its own)."""
    from moto.ec2.models import ec2_backends
    from moto.ec2.models.instances import StateReason

    backend = ec2_backends[ACCOUNT][region]
    backend.terminate_instances(list(instance_ids))
    for iid in instance_ids:
        inst = backend.get_instance(iid)
        inst.state_reason = StateReason(
            "Server.SpotInstanceTermination: Spot instance termination",
            "Server.SpotInstanceTermination",
        )


# ---------------------------------------------------------------------------- the DLAMIs
# The Deep Learning AMIs as AWS publishes them (Amazon-owned images, some behind public SSM
# parameters), each with what it ships: the Python environments on it, and until when its
# framework has patch support. Only what a source says:
# * GPU PyTorch DLAMIs: python at /opt/pytorch/bin/python; PyTorch 2.7 left patch support on
#   2026-04-23 (https://docs.aws.amazon.com/dlami/latest/devguide/support-policy.html); PyTorch
#   2.11 on Ubuntu 24.04 was released 2026-10 (its release notes).
# * Neuron: from Neuron 2.32 torch-neuronx is not preinstalled on the multi-framework DLAMI; 2.33
#   ships /opt/aws_neuronx_venv_torch_neuronx_2_14_0 in the separate "Deep Learning AMI Neuron
#   torch-neuronx 2.14.0" image (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/dlami/index.html);
#   PyTorch 2.9 Neuron DLAMIs were published through Neuron 2.31 (no "latest" parameter since).
DLAMIS: dict[str, dict[str, Any]] = {
    "Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.7 (Ubuntu 22.04) 20260301": {
        "venvs": ["/opt/pytorch"],
        "patch_support_until": "2026-04-23",
        "ssm": "/aws/service/deeplearning/ami/x86_64/oss-nvidia-driver-gpu-pytorch-2.7-ubuntu-22.04/latest/ami-id",
    },
    "Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.11 (Ubuntu 24.04) 20261009": {
        "venvs": ["/opt/pytorch"],
        "patch_support_until": None,  # current
        "ssm": "/aws/service/deeplearning/ami/x86_64/oss-nvidia-driver-gpu-pytorch-2.11-ubuntu-24.04/latest/ami-id",
    },
    "Deep Learning AMI Neuron (Ubuntu 24.04) 20261020": {
        "venvs": ["/opt/aws_neuronx_venv_jax_0_7"],  # multi-framework: no torch-neuronx since 2.32
        "ssm": "/aws/service/neuron/dlami/multi-framework/ubuntu-24.04/latest/image_id",
    },
    "Deep Learning AMI Neuron torch-neuronx 2.14.0 (Ubuntu 24.04) 20261020": {
        "venvs": ["/opt/aws_neuronx_venv_torch_neuronx_2_14_0"],
    },
    "Deep Learning AMI Neuron PyTorch 2.9 (Ubuntu 24.04) 20260115": {
        "venvs": ["/opt/aws_neuronx_venv_pytorch_2_9"],
    },
    "Deep Learning AMI Neuron PyTorch 2.9 (Ubuntu 24.04) 20260612": {
        "venvs": ["/opt/aws_neuronx_venv_pytorch_2_9"],
    },
}


def publish_dlamis(region: str = "us-east-1") -> dict[str, str]:
    """Register :data:`DLAMIS` as Amazon-owned public images in moto (no API exists for
    publishing as Amazon; the backend is driven directly, as for the SSM parameters) and their
    SSM parameters. Returns image name -> AMI id."""
    import datetime
    import uuid

    from moto.ec2.models import ec2_backends
    from moto.ec2.models.amis import Ami

    backend = ec2_backends[ACCOUNT][region]
    out = {}
    for name, facts in DLAMIS.items():
        ami_id = "ami-" + uuid.uuid4().hex[:17]
        stamp = name.rsplit(" ", 1)[-1]
        backend.amis[ami_id] = Ami(
            backend,
            ami_id,
            name=name,
            description=name,
            owner_id="801119661308",
            owner_alias="amazon",
            public=True,
            creation_date=datetime.datetime.strptime(stamp, "%Y%m%d").replace(
                tzinfo=datetime.timezone.utc
            ),
            root_device_name="/dev/sda1",
            region_name=region,
        )
        out[name] = ami_id
        if facts.get("ssm"):
            seed_public_parameter(facts["ssm"], ami_id, region)
    return out


def image_runs(name: str, python: str) -> str | None:
    """Why ``python`` cannot run on the DLAMI named ``name`` (as the host's shell would say), or
    None when the image ships it."""
    venvs = DLAMIS[name]["venvs"]
    if any(python.startswith(v + "/bin/") for v in venvs):
        return None
    return f"bash: {python}: No such file or directory (the image ships {', '.join(venvs)})"
