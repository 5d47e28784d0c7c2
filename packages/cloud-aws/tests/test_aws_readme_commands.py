"""Every `aios launch` command packages/cloud-aws/README.md prints, run as printed (with the
variables it exports) against moto behind the EC2 rules proxy, as dry runs (a real launch needs
EC2's GPUs and Trainium; test_aws_e2e.py runs the launch itself on the stand-in). The account
has what the README asks the user to have: an instance profile whose role may use S3."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aios_cloud.testing.readme import as_dry_run, readme_commands, readme_exports

README = Path(__file__).resolve().parents[1] / "README.md"
COMMANDS = readme_commands(README)


def test_the_readme_prints_these_commands() -> None:
    assert len(COMMANDS) == 3, COMMANDS


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: c[4])
def test_readme_launch_command_as_a_dry_run(cmd: list[str], aws: Any, tmp_path: Path) -> None:
    import boto3
    from aios_cloud_aws.ec2params import EC2_TRUST

    exports = readme_exports(README)
    profile = exports["AIOS_AWS__IAM_INSTANCE_PROFILE"]
    iam = boto3.client("iam", region_name="us-east-1", endpoint_url=aws.endpoint)
    iam.create_role(RoleName=profile, AssumeRolePolicyDocument=json.dumps(EC2_TRUST))
    s3 = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": ["s3:*"], "Resource": "*"}],
    }
    iam.put_role_policy(RoleName=profile, PolicyName="s3", PolicyDocument=json.dumps(s3))
    iam.create_instance_profile(InstanceProfileName=profile)
    iam.add_role_to_instance_profile(InstanceProfileName=profile, RoleName=profile)
    env = {**os.environ, **exports, "AIOS_HOME": str(tmp_path / "aios-home"), "COLUMNS": "200"}
    work = tmp_path / "proj"
    work.mkdir()
    (work / "train.py").write_text("print('hi')\n")
    r = subprocess.run(
        [sys.executable, "-m", "aios.cli.main", *as_dry_run(cmd)[1:]],
        env=env, cwd=work, text=True, capture_output=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "# dry run" in r.stdout and "aws ec2 run-instances" in r.stdout
    assert not aws.proxy.called("RunInstances"), "a dry run launched instances"
