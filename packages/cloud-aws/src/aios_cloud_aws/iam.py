"""IAM: the instance profile that gives the autostop agent on the head host the rights to stop
or delete its own cluster, and the checks that it will have them."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

from aios_cloud.provider.data import ClusterRequest
from aios_cloud.provider.errors import CloudError

from aios_cloud_aws.base import NOT_FOUND_RETRIES, _doc
from aios_cloud_aws.ec2params import (
    AGENT_ACTIONS,
    AUTOSTOP_PROFILE,
    EC2_TRUST,
    agent_policy,
    allowed,
)
from aios_cloud_aws.errors import error_code, translate
from aios_cloud_aws.network import AwsNetwork


class AwsIam(AwsNetwork):
    """The EC2 provider's IAM for the autostop agent."""

    # ------------------------------------------------------------------ autostop rights
    def prepare_autostop(
        self, request: ClusterRequest, action: str, dry_run: bool = False
    ) -> ClusterRequest:
        """The agent stops/deletes the cluster with the instance profile's credentials. With
        ``aws.iam_instance_profile`` set, its role must allow what the agent calls (checked in
        IAM, exit 2 naming what is missing); unset, aios creates (once per account) and attaches
        :data:`AUTOSTOP_PROFILE` with exactly those rights. Before anything is billed."""
        prof = self.settings.iam_instance_profile
        if prof:
            if not dry_run:
                self._require_agent_rights(
                    prof,
                    action,
                    "the cluster",
                    "add them to its role (on resources tagged aios:cluster), or unset "
                    f"aws.iam_instance_profile to let aios create '{AUTOSTOP_PROFILE}'",
                )
            return request
        if not dry_run:
            self._ensure_agent_profile()
        return replace(request, extra={**request.extra, "instance_profile": AUTOSTOP_PROFILE})

    def grant_autostop(self, name: str, zone: str | None, action: str) -> None:
        """A cluster launched without ``--autostop`` has no instance profile (or the user's):
        its instances get the one :meth:`prepare_autostop` would have given them, attached to
        the running instances (``AssociateIamInstanceProfile``), before the agent is installed.
        An instance that already carries a profile keeps it (replacing it would take the user's
        own rights away): its role must allow the agent's calls, or this names what is missing."""
        ec2 = self.ec2(self._region(zone))
        ids = [
            i["InstanceId"] for i in self._instances(ec2, name, ["pending", "running", "stopped"])
        ]
        if not ids:
            raise CloudError(f"cluster {name} has no instances", f"aios status {name} --refresh")
        # the associations EC2 knows (a profile given at launch is one too)
        held: dict[str, str] = {}
        for a in self._call(
            ec2,
            "DescribeIamInstanceProfileAssociations",
            Filters=[{"Name": "instance-id", "Values": ids}],
        ).get("IamInstanceProfileAssociations", []):
            if a.get("State") in ("associating", "associated"):
                held[a["InstanceId"]] = a["IamInstanceProfile"]["Arn"].rsplit("/", 1)[-1]
        for held_prof in sorted(set(held.values())):
            self._require_agent_rights(
                held_prof,
                action,
                name,
                "add them to its role (on resources tagged aios:cluster), then run "
                "`aios autostop` again",
            )
        bare = [i for i in ids if i not in held]
        if not bare:
            return
        req = self.prepare_autostop(ClusterRequest(name=name, accelerator="", zone=zone), action)
        prof = str(self.settings.iam_instance_profile or req.extra.get("instance_profile") or "")
        assert prof
        spec = {"Arn": prof} if prof.startswith("arn:") else {"Name": prof}
        for iid in bare:
            for attempt in range(NOT_FOUND_RETRIES):  # a new profile: IAM is eventually consistent
                try:
                    self._call(
                        ec2, "AssociateIamInstanceProfile", IamInstanceProfile=spec, InstanceId=iid
                    )
                    break
                except CloudError as exc:
                    code = error_code(exc.__cause__) if exc.__cause__ else ""
                    if code != "InvalidParameterValue" or attempt == NOT_FOUND_RETRIES - 1:
                        raise
                    time.sleep(min(30.0, self.poll_interval * 2**attempt))
        self.log(
            f"{name}: instance profile {prof.rsplit('/', 1)[-1]} attached to {len(bare)} "
            f"instance(s): the autostop agent may {action} the cluster"
        )

    def _require_agent_rights(self, prof: str, action: str, what: str, fix: str) -> None:
        """Instance profile ``prof``'s role must allow every call the agent makes to ``action``
        ``what``, read from IAM; else one line naming what is missing."""
        docs = self._profile_policies(prof)
        missing = [a for a in AGENT_ACTIONS[action] if not allowed(docs, a)]
        if missing:
            raise CloudError(
                f"the autostop agent could not {action} {what}: instance profile '{prof}' does "
                f"not allow {', '.join(missing)}",
                fix,
            )

    def _iam_fix(self) -> str:
        return (
            f"ask an admin to create instance profile {AUTOSTOP_PROFILE} (the IAM commands of "
            "`aios launch --autostop N ... --dry-run`) or to grant you iam:CreateRole, "
            "iam:PutRolePolicy, iam:CreateInstanceProfile, iam:AddRoleToInstanceProfile and "
            "iam:PassRole; or set aws.iam_instance_profile to a profile that may stop/terminate "
            "the cluster"
        )

    def _ensure_agent_profile(self) -> None:
        iam = self.clients.client("iam", self.region)
        try:
            try:
                roles = iam.get_instance_profile(InstanceProfileName=AUTOSTOP_PROFILE)[
                    "InstanceProfile"
                ]["Roles"]
            except Exception as exc:
                if error_code(exc) != "NoSuchEntity":
                    raise
                roles = None
            if roles is None:
                self.log(f"creating IAM instance profile {AUTOSTOP_PROFILE} for the autostop agent")
                try:
                    iam.create_role(
                        RoleName=AUTOSTOP_PROFILE,
                        AssumeRolePolicyDocument=json.dumps(EC2_TRUST),
                        Description="aios autostop agent: stops/deletes its own aios cluster",
                        Tags=[{"Key": "aios:managed-by", "Value": "aios"}],
                    )
                except Exception as exc:
                    if error_code(exc) != "EntityAlreadyExists":
                        raise
                iam.create_instance_profile(InstanceProfileName=AUTOSTOP_PROFILE)
                roles = []
            if not any(r.get("RoleName") == AUTOSTOP_PROFILE for r in roles):
                iam.add_role_to_instance_profile(
                    InstanceProfileName=AUTOSTOP_PROFILE, RoleName=AUTOSTOP_PROFILE
                )
            # always (re)written: the rights follow what this aios version's agent calls
            iam.put_role_policy(
                RoleName=AUTOSTOP_PROFILE,
                PolicyName="aios-agent",
                PolicyDocument=json.dumps(agent_policy()),
            )
        except Exception as exc:
            code = error_code(exc)
            if code in ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation"):
                raise CloudError(
                    f"aios may not create the IAM instance profile the autostop agent needs "
                    f"({code})",
                    self._iam_fix(),
                ) from None
            raise translate(exc, "CreateInstanceProfile", "iam") from exc

    def _profile_policies(self, prof: str) -> list[dict[str, Any]]:
        """The policy documents of the roles of instance profile ``prof``."""
        iam = self.clients.client("iam", self.region)
        name = prof.rsplit("/", 1)[-1]
        try:
            roles = iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]["Roles"]
            docs: list[dict[str, Any]] = []
            for role in roles:
                rn = role["RoleName"]
                for pn in iam.list_role_policies(RoleName=rn)["PolicyNames"]:
                    docs.append(
                        _doc(iam.get_role_policy(RoleName=rn, PolicyName=pn)["PolicyDocument"])
                    )
                for ap in iam.list_attached_role_policies(RoleName=rn)["AttachedPolicies"]:
                    pol = iam.get_policy(PolicyArn=ap["PolicyArn"])["Policy"]
                    ver = iam.get_policy_version(
                        PolicyArn=ap["PolicyArn"], VersionId=pol["DefaultVersionId"]
                    )
                    docs.append(_doc(ver["PolicyVersion"]["Document"]))
            return docs
        except Exception as exc:
            if error_code(exc) == "NoSuchEntity":
                raise CloudError(
                    f"IAM instance profile '{name}' does not exist",
                    f"create it, or unset aws.iam_instance_profile to let aios create "
                    f"'{AUTOSTOP_PROFILE}'",
                ) from None
            raise translate(exc, "GetInstanceProfile", "iam") from exc

    def _check_instance_profile(self, region: str) -> None:
        prof = self.settings.iam_instance_profile
        if not prof or prof.startswith("arn:"):
            return
        iam = self.clients.client("iam", region)
        try:
            iam.get_instance_profile(InstanceProfileName=prof)
        except Exception as exc:
            if error_code(exc) == "NoSuchEntity":
                raise CloudError(
                    f"IAM instance profile '{prof}' does not exist",
                    "create it (`aws iam create-instance-profile`) with a role that can "
                    "read/write your S3 bucket, or unset aws.iam_instance_profile",
                ) from None
            raise translate(exc, "GetInstanceProfile", "iam") from exc
