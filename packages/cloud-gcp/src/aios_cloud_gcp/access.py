"""Access: OS Login (the SSH key in the user's profile, the POSIX user), and the rights the
autostop agent on the head host needs to stop or delete its own slice."""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any

from aios_cloud.provider.data import ClusterRequest
from aios_cloud.provider.errors import CloudError

from aios_cloud_gcp.base import (
    AGENT_PERMISSIONS,
    ROLE_PERMISSIONS,
    TransientCloudError,
    has_permission,
)
from aios_cloud_gcp.offerings import GcpOfferings


class GcpAccess(GcpOfferings):
    """The TPU provider's OS Login and IAM steps."""

    # -------------------------------------------------------------- OS Login
    def os_login_account(self) -> str:
        if self.settings.os_login_user:
            return self.settings.os_login_user
        email = getattr(self._credentials(), "service_account_email", None)
        if not email or email == "default":
            raise CloudError(
                "gcp.os_login is on but the account is unknown",
                "set gcp.os_login_user to your account email",
            )
        return email

    def prepare(self, request: ClusterRequest) -> ClusterRequest:
        """With ``gcp.os_login``: import aios's public key into the account's OS Login profile
        (``users.importSshPublicKey``) and log in as the profile's POSIX user."""
        if not self.settings.os_login:
            return request
        if not request.ssh_public_key:
            raise CloudError(
                "no SSH public key to import into OS Login",
                "let aios create its key (aios launch does)",
            )
        import urllib.parse

        from google.auth.transport.requests import AuthorizedSession

        account = self.os_login_account()
        url = (
            f"{self.settings.os_login_endpoint.rstrip('/')}/v1/users/{urllib.parse.quote(account)}:importSshPublicKey"
            f"?projectId={urllib.parse.quote(self.project(request.project))}"
        )
        session = AuthorizedSession(self._credentials())
        try:
            r = session.post(url, json={"key": request.ssh_public_key}, timeout=60)
        except Exception as exc:  # noqa: BLE001
            raise TransientCloudError(
                f"OS Login: {type(exc).__name__}: {exc}", "check the network"
            ) from None
        if r.status_code != 200:
            msg = (
                r.json().get("error", {}).get("message", r.text[:200])
                if r.headers.get("content-type", "").startswith("application/json")
                else r.text[:200]
            )
            raise CloudError(
                f"OS Login refused the key for {account} ({r.status_code}): {msg}",
                "check the account has roles/compute.osAdminLogin (or osLogin) on the project",
            )
        accounts = (r.json().get("loginProfile") or {}).get("posixAccounts") or []
        user = next((a.get("username") for a in accounts if a.get("primary")), None) or (
            accounts[0].get("username") if accounts else None
        )
        if not user:
            raise CloudError(
                f"the OS Login profile of {account} has no POSIX account",
                "log in once with `gcloud compute ssh` to create it",
            )
        return replace(request, ssh_user=user)

    # -------------------------------------------------------------- autostop rights
    def grant_autostop(self, name: str, zone: str | None, action: str) -> None:
        """``aios autostop NAME MIN`` later: a TPU VM's service account cannot be changed on a
        running node, so its rights are checked as at launch (:meth:`prepare_autostop`), and a
        missing grant is one line, exit 2, before the agent is installed."""
        self.prepare_autostop(ClusterRequest(name=name, accelerator="", zone=zone), action)

    def prepare_autostop(
        self, request: ClusterRequest, action: str, dry_run: bool = False
    ) -> ClusterRequest:
        """The agent stops/deletes the slice as the TPU VM's service account (``gcp.service_account``,
        else the project's default compute service account). Organisations often strip that
        account of its default Editor role, so its roles are read from the project's IAM policy
        (Cloud Resource Manager ``getIamPolicy``) before anything is created: missing TPU rights
        are one line, exit 2, naming the grant; a policy aios may not read, or a custom role, is a
        note naming the same grant."""
        if dry_run:
            return request
        project = self.project(request.project)
        need = AGENT_PERMISSIONS[action]
        try:
            sa = self.settings.service_account or (
                f"{self._crm('GET', project)['projectNumber']}-compute@developer.gserviceaccount.com"
            )
            policy = self._crm("POST", f"{project}:getIamPolicy")
        except CloudError as exc:
            sa = self.settings.service_account or "the default compute service account"
            print(
                f"[aios] note: cannot check that {sa} may {action} the slice ({exc.message}); "
                f"the autostop agent needs {', '.join(need)}",
                file=sys.stderr,
            )
            return request
        member = f"serviceAccount:{sa}"
        roles = {b["role"] for b in policy.get("bindings", []) if member in b.get("members", [])}
        missing = [p for p in need if not has_permission(roles, p)]
        grant = (
            f"gcloud projects add-iam-policy-binding {project} --member={member} "
            "--role=roles/tpu.admin"
        )
        if missing and set(roles) - set(ROLE_PERMISSIONS):
            print(
                f"[aios] note: {sa} has roles aios cannot read ({', '.join(sorted(roles))}); the "
                f"autostop agent needs {', '.join(need)} (`{grant}` grants them)",
                file=sys.stderr,
            )
        elif missing:
            raise CloudError(
                f"the autostop agent could not {action} the slice: service account {sa} lacks "
                f"{', '.join(missing)}",
                f"grant them (`{grant}`), or set gcp.service_account to an account that has them",
            )
        return request

    def _crm(self, method: str, path: str) -> dict[str, Any]:
        """A Cloud Resource Manager v1 ``projects`` call (the local test service serves it at
        ``gcp.endpoint``)."""
        from google.auth.transport.requests import AuthorizedSession

        base = self.settings.endpoint or "https://cloudresourcemanager.googleapis.com"
        try:
            r = AuthorizedSession(self._credentials()).request(
                method,
                f"{base.rstrip('/')}/v1/projects/{path}",
                json={} if method == "POST" else None,
                timeout=30,
            )
        except Exception as exc:  # noqa: BLE001 - one line
            raise CloudError(f"Cloud Resource Manager: {type(exc).__name__}", "") from None
        if r.status_code != 200:
            msg = (r.json().get("error") or {}).get("message", r.text[:200]) if r.content else ""
            raise CloudError(f"Cloud Resource Manager {r.status_code}: {msg}", "")
        return dict(r.json())
