"""AWS errors as one-line aios errors with a fix.

:func:`translate` maps botocore exceptions (``ClientError`` codes, ``NoCredentialsError``,
SSO token errors, connection errors) onto the cloud layer's error classes so that the core's
zone failover sees capacity (:class:`CapacityError`), quota (:class:`QuotaError`) and transient
errors, and the CLI prints one line and exits 2. Messages never carry credentials: AWS error
texts do not contain keys, and the encoded authorization blob is dropped.
"""

from __future__ import annotations

import re

from aios.errors import AiosError
from aios_cloud.provider.errors import CapacityError, CloudError, CredentialsError, QuotaError


class UnknownInstanceType(CloudError):
    """The instance type is not in the aios catalog."""


class RegionUnavailable(CloudError):
    """The region does not offer the instance type."""


class PermissionDenied(CloudError):
    """The AWS identity lacks an IAM permission (``UnauthorizedOperation``, ``AccessDenied``)."""


class TransientAwsError(CloudError):
    """Throttling or an AWS-side internal error; the same zone may be retried."""


CAPACITY_CODES = {
    "InsufficientInstanceCapacity",
    "InsufficientCapacity",
    "InsufficientHostCapacity",
    "InsufficientReservedInstanceCapacity",
    "InsufficientCapacityOnOutpost",
    "SpotMaxPriceTooLow",
    "Unsupported",  # the type is not offered in this availability zone: the next one may
}
QUOTA_CODES = {
    "VcpuLimitExceeded",
    "InstanceLimitExceeded",
    "MaxSpotInstanceCountExceeded",
    "AddressLimitExceeded",
    "PlacementGroupLimitExceeded",
    "SecurityGroupLimitExceeded",
    "ResourceLimitExceeded",
    "NetworkInterfaceLimitExceeded",
}
TRANSIENT_CODES = {
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "InternalError",
    "InternalFailure",
    "ServiceUnavailable",
    "Unavailable",
    "RequestTimeout",
    "SlowDown",
}
EXPIRED_CODES = {"ExpiredToken", "ExpiredTokenException", "RequestExpired", "TokenRefreshRequired"}
BAD_CREDENTIAL_CODES = {
    "AuthFailure",
    "InvalidClientTokenId",
    "UnrecognizedClientException",
    "SignatureDoesNotMatch",
    "IncompleteSignature",
    "InvalidAccessKeyId",
    "InvalidToken",
}
DENIED_CODES = {
    "UnauthorizedOperation",
    "AccessDenied",
    "AccessDeniedException",
    "Client.UnauthorizedOperation",
}

EXPIRED_FIX = "refresh your session (`aws sso login`, or new temporary credentials / AWS_SESSION_TOKEN) and retry"
NO_CREDENTIALS_FIX = (
    "run `aws configure` or `aws sso login`, set AWS_PROFILE, or export "
    "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
)

_SERVICE_PREFIX = {"ec2": "ec2", "ssm": "ssm", "s3": "s3", "iam": "iam", "sts": "sts"}

# Permission hints for operations whose failure has a simple alternative.
_PERMISSION_ALTERNATIVES = {
    "ImportKeyPair": "or set aws.key_name to an existing key pair (and aws.ssh_private_key to its private key)",
    "CreateKeyPair": "or set aws.key_name to an existing key pair (and aws.ssh_private_key to its private key)",
    "DescribeKeyPairs": "or set aws.key_name to an existing key pair",
    "CreateSecurityGroup": "or set aws.security_group_ids to an existing group that allows SSH",
    "AuthorizeSecurityGroupIngress": "or set aws.security_group_ids to an existing group that allows SSH",
    "CreatePlacementGroup": "or set aws.placement_group=false",
    "GetParameter": "or set aws.ami to an AMI id",
    "GetParameters": "or set aws.ami to an AMI id",
    "GetInstanceProfile": "or unset aws.iam_instance_profile",
}


def _clean(message: str) -> str:
    message = re.sub(r"\s*Encoded authorization failure message:.*", "", message, flags=re.S)
    return " ".join(message.split())[:300]


def translate(
    exc: BaseException, operation: str | None = None, service: str = "ec2"
) -> BaseException:
    """An aios error for ``exc`` (returned, not raised), or ``exc`` itself when it is not an
    AWS error. ``operation`` is the API call (``RunInstances``) for the message."""

    if isinstance(exc, AiosError):
        return exc
    try:
        import botocore.exceptions as bex
    except ImportError:  # pragma: no cover - boto3 is a dependency
        return exc
    if isinstance(exc, (bex.NoCredentialsError, bex.PartialCredentialsError)):
        return CredentialsError("no AWS credentials found", NO_CREDENTIALS_FIX)
    if isinstance(exc, bex.NoRegionError):
        return CloudError(
            "no AWS region configured",
            "pass --region, set aws.region, or export AWS_DEFAULT_REGION",
        )
    sso = tuple(
        getattr(bex, n)
        for n in ("TokenRetrievalError", "SSOTokenLoadError", "UnauthorizedSSOTokenError")
        if hasattr(bex, n)
    )
    if sso and isinstance(exc, sso):
        return CredentialsError(
            "the AWS SSO session has expired",
            "run `aws sso login` (with --profile if you use one) and retry",
        )
    if isinstance(exc, bex.ProfileNotFound):
        return CredentialsError(
            f"AWS profile not found: {_clean(str(exc))}",
            "check AWS_PROFILE / aws.profile against `aws configure list-profiles`",
        )
    if isinstance(exc, (bex.EndpointConnectionError, bex.ConnectTimeoutError)):
        return TransientAwsError(
            f"cannot reach AWS: {_clean(str(exc))}",
            "check the network (and AWS_ENDPOINT_URL if you set one)",
        )
    if not isinstance(exc, bex.ClientError):
        return exc
    err = exc.response.get("Error", {}) if hasattr(exc, "response") else {}
    code = str(err.get("Code", "")).removeprefix("Server.").removeprefix("Client.")
    message = _clean(str(err.get("Message", "")) or str(exc))
    op = operation or getattr(exc, "operation_name", None) or "request"
    if code in EXPIRED_CODES:
        return CredentialsError(f"the AWS session has expired ({code} on {op})", EXPIRED_FIX)
    if code in BAD_CREDENTIAL_CODES:
        return CredentialsError(
            f"AWS rejected the credentials ({code} on {op})", NO_CREDENTIALS_FIX
        )
    if code in DENIED_CODES or exc.response.get("Error", {}).get("Code") in DENIED_CODES:
        m = re.search(r"perform: ([\w-]+:\w+)", message)
        action = m.group(1) if m else f"{_SERVICE_PREFIX.get(service, service)}:{op}"
        alt = _PERMISSION_ALTERNATIVES.get(op, "")
        return PermissionDenied(
            f"missing AWS permission {action} ({code})",
            f"grant {action} to your IAM identity{', ' + alt if alt else ''}",
        )
    if code in CAPACITY_CODES:
        return CapacityError(
            f"{code}: {message}",
            "aios tries the next availability zone; or try another region, on-demand, or fewer nodes",
        )
    if code in QUOTA_CODES:
        return QuotaError(
            f"{code}: {message}",
            "request a quota increase in Service Quotas (EC2: 'Running On-Demand P instances' / "
            "'Running On-Demand Trn instances' / 'All P Spot Instance Requests'), or use fewer nodes",
        )
    if code in TRANSIENT_CODES:
        return TransientAwsError(f"{code} on {op}: {message}", "retry in a moment")
    if code == "ParameterNotFound":
        return CloudError(
            f"SSM parameter not found: {message}",
            "set aws.gpu_ami_parameter / aws.neuron_ami_parameter to a current DLAMI "
            "parameter, or aws.ami to an AMI id",
        )
    if code.startswith("InvalidAMIID"):
        return CloudError(
            f"{code}: {message}",
            "set aws.ami to an AMI available in this region, or unset it to use the DLAMI",
        )
    if code.startswith("InvalidKeyPair"):
        return CloudError(
            f"{code}: {message}",
            "set aws.key_name to a key pair of this region (`aws ec2 describe-key-pairs`), or unset it",
        )
    if code.startswith(("InvalidGroup", "InvalidSecurityGroup")):
        return CloudError(
            f"{code}: {message}",
            "fix aws.security_group_ids (ids of this region's VPC), or unset it",
        )
    if code.startswith("InvalidSubnet"):
        return CloudError(
            f"{code}: {message}",
            "fix aws.subnet_ids (ids of this region), or unset it to use the default VPC",
        )
    if code in ("NoSuchEntity", "NoSuchEntityException"):
        return CloudError(
            f"{code} on {op}: {message}",
            "create it first or fix the name in your aws config section",
        )
    return CloudError(
        f"AWS {op} failed: {code}: {message}",
        "see the AWS message; rerun with --debug for the full response",
    )


def error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""
