"""Bad input: one line naming the problem and the fix, exit status 2, nothing left behind, no
secret anywhere. Run through the real ``aios launch`` against moto."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from aios_cloud.provider.data import ClusterRequest
from aios_cloud.provider.errors import CredentialsError
from aios_cloud_aws.errors import PermissionDenied, RegionUnavailable, UnknownInstanceType
from aios_cloud_aws.testing.inventory import leftovers
from aios_cloud_aws.testing.moto import FAKE_SECRET


def launch(tmp: Path, *args: str, env_drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    (tmp / "train.py").write_text("print('train')\n")
    env = os.environ.copy()
    env["AIOS_HOME"] = str(tmp / "home")
    for k in env_drop:
        env.pop(k, None)
    argv = [
        sys.executable,
        "-m",
        "aios.cli.main",
        "launch",
        "--cloud",
        "aws",
        "--no-setup",
        *args,
        "train.py",
    ]
    return subprocess.run(argv, cwd=tmp, capture_output=True, text=True, timeout=180, env=env)


def one_error_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("aios: error:")]
    assert len(errors) == 1, r.stderr
    assert "Traceback" not in r.stderr
    return errors[0]


def no_secret_anywhere(tmp: Path, *texts: str) -> None:
    for t in texts:
        assert FAKE_SECRET not in t
    for p in (tmp / "home").rglob("*"):
        if p.is_file():
            assert FAKE_SECRET.encode() not in p.read_bytes(), p


def test_unknown_instance_type(aws, tmp_path, make_provider):
    """The live answer decides: a type aios's table does not list is asked of EC2
    (DescribeInstanceTypes), and one EC2 does not know is refused in one line, before any
    instance is launched."""
    p = make_provider()
    p.validate(ClusterRequest(name="x", accelerator="p5.96xlarge"))  # well-formed: EC2 decides
    with pytest.raises(UnknownInstanceType) as ei:
        p.zones("p5.96xlarge")
    assert "EC2 does not know it" in str(ei.value) and "did you mean p5.48xlarge" in ei.value.fix
    r = launch(tmp_path, "-a", "p9.48xlarge")
    line = one_error_line(r)
    assert "unknown instance type 'p9.48xlarge'" in line and "aios catalog --cloud aws" in line
    assert not aws.proxy.called("RunInstances")
    r = launch(tmp_path, "-a", "p5 48xlarge")  # not a type name at all: no call
    assert "is not an EC2 instance type name" in one_error_line(r)


def test_a_type_the_table_does_not_list_launches_with_ec2s_facts(aws, make_provider, pubkey):
    """A type missing from aios's table (here the table is emptied of p5en) is planned from
    EC2's own description: devices and EFA interfaces (16 on p5en) from DescribeInstanceTypes,
    "unknown price" instead of a refusal."""
    from aios_cloud_aws import catalog as cat

    saved = cat.INSTANCE_TYPES.pop("p5en.48xlarge")
    try:
        p = make_provider()
        assert p.entry("p5en.48xlarge").extra["prices_recorded"] == "unknown price"
        zones = p.zones("p5en.48xlarge")
        t = cat.lookup("p5en.48xlarge")
        assert zones and t.accelerators == 8 and t.efa_interfaces == 16 and not t.listed
        req = p.validate(
            ClusterRequest(
                name="unl",
                accelerator="p5en.48xlarge",
                nodes=2,
                zone=zones[0],
                ssh_public_key=pubkey,
            )
        )
        plan = p.plan_create(req)
        assert plan["efa_interfaces_per_node"] == 16 and plan["hourly_usd"] is None
        assert plan["price"] == "unknown price"
    finally:
        cat.INSTANCE_TYPES["p5en.48xlarge"] = saved
        cat.LIVE.clear()


def test_region_without_the_type(aws, tmp_path, make_provider):
    """Which regions offer a type is EC2's live answer (DescribeInstanceTypeOfferings), not the
    recorded table's."""
    with pytest.raises(RegionUnavailable):
        make_provider(region="eu-west-1").zones("trn2.48xlarge")
    r = launch(tmp_path, "-a", "trn2.48xlarge", "--region", "eu-west-1")
    line = one_error_line(r)
    assert "region eu-west-1 does not offer trn2.48xlarge" in line and "--region us-east-2" in line
    assert aws.proxy.called("DescribeInstanceTypeOfferings")
    assert not aws.proxy.called("RunInstances")


def test_no_credentials(aws, tmp_path, make_provider, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(CredentialsError, match="no AWS credentials found"):
        make_provider().describe_credentials()
    r = launch(tmp_path, "-a", "trn1.2xlarge", "--name", "nocreds")
    line = one_error_line(r)
    assert "no AWS credentials found" in line and "aws configure" in line
    assert not (tmp_path / "home" / "state.db").exists() or "nocreds" not in _clusters(tmp_path)


def test_expired_session(aws, tmp_path):
    aws.proxy.inject(
        "*", "ExpiredToken", "The security token included in the request is expired", status=400
    )
    r = launch(tmp_path, "-a", "trn1.2xlarge", "--name", "expired")
    line = one_error_line(r)
    assert "AWS session has expired" in line and "aws sso login" in line
    assert "nocreds" not in _clusters(tmp_path) and "expired" not in _clusters(tmp_path)
    no_secret_anywhere(tmp_path, r.stdout, r.stderr)


def test_missing_key_pair_permission_leaves_nothing(aws, tmp_path):
    aws.proxy.inject(
        "ImportKeyPair",
        "UnauthorizedOperation",
        "You are not authorized to perform this operation. User: arn:aws:iam::123456789012:user/dev is not "
        "authorized to perform: ec2:ImportKeyPair on resource: arn:aws:ec2:us-east-1:123456789012:key-pair/aios-perm "
        "because no identity-based policy allows the ec2:ImportKeyPair action. Encoded authorization failure message: "
        "Zm9vYmFyYmF6" * 3,
        status=403,
    )
    r = launch(
        tmp_path, "-a", "trn1.2xlarge", "--name", "perm", "--zone", "us-east-1a", "--no-failover"
    )
    line = one_error_line(r)
    assert "missing AWS permission ec2:ImportKeyPair" in line and "aws.key_name" in line
    assert "Encoded authorization" not in line
    assert leftovers(aws.ec2, "perm", aws.proxy) == {}
    assert "perm" not in _clusters(tmp_path)
    no_secret_anywhere(tmp_path, r.stdout, r.stderr)


def test_missing_ssm_parameter_names_the_setting(aws, make_provider, pubkey):
    p = make_provider(
        neuron_ami_parameter="/aws/service/neuron/dlami/does-not-exist/latest/image_id"
    )
    from aios_cloud.provider.errors import CloudError

    with pytest.raises(CloudError) as ei:
        p.create(
            p.validate(
                ClusterRequest(
                    name="noami",
                    accelerator="trn1.2xlarge",
                    zone="us-east-1a",
                    ssh_public_key=pubkey,
                )
            )
        )
    assert (
        "SSM parameter not found" in ei.value.message and "aws.neuron_ami_parameter" in ei.value.fix
    )


def test_translate_unit_cases():
    from aios_cloud.provider.errors import CapacityError, QuotaError
    from aios_cloud_aws.errors import TransientAwsError, translate
    from botocore.exceptions import ClientError, NoCredentialsError

    def ce(code, op="RunInstances"):
        return ClientError({"Error": {"Code": code, "Message": f"msg {code}"}}, op)

    assert isinstance(translate(ce("InsufficientInstanceCapacity")), CapacityError)
    assert isinstance(translate(ce("Unsupported")), CapacityError)
    assert isinstance(translate(ce("VcpuLimitExceeded")), QuotaError)
    assert isinstance(translate(ce("RequestLimitExceeded")), TransientAwsError)
    assert isinstance(translate(ce("RequestExpired")), CredentialsError)
    assert isinstance(translate(ce("AuthFailure")), CredentialsError)
    assert isinstance(translate(NoCredentialsError()), CredentialsError)
    denied = translate(ce("UnauthorizedOperation", "CreatePlacementGroup"))
    assert (
        isinstance(denied, PermissionDenied)
        and "ec2:CreatePlacementGroup" in denied.message
        and "aws.placement_group=false" in denied.fix
    )
    plain = ValueError("not aws")
    assert translate(plain) is plain


def _clusters(tmp: Path) -> str:
    db = tmp / "home" / "state.db"
    if not db.exists():
        return ""
    import sqlite3

    with sqlite3.connect(db) as c:
        return " ".join(r[0] for r in c.execute("select name from clusters"))
