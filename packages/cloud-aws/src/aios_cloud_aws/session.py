"""boto3 sessions and clients (imported lazily: nothing here runs at plugin import).

Endpoints follow botocore's own settings (``AWS_ENDPOINT_URL``, ``AWS_ENDPOINT_URL_EC2``,
``AWS_ENDPOINT_URL_S3``, ...), which is how the tests point the real boto3 at a moto server.
Retries use botocore's ``standard`` mode with ``aws.max_attempts`` attempts; RunInstances carries
a ClientToken so a retried call never launches twice.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from aios_cloud.provider.errors import CloudError, CredentialsError

from aios_cloud_aws.errors import NO_CREDENTIALS_FIX, translate
from aios_cloud_aws.settings import AwsSettings

_ZONE_RE = re.compile(r"^([a-z]{2}(?:-gov|-iso[a-z]*)?-[a-z]+-\d+)")


def region_of_zone(zone: str) -> str:
    """``us-east-1a`` -> ``us-east-1`` (also local zones: ``us-east-1-bos-1a``)."""
    m = _ZONE_RE.match(zone)
    if not m:
        raise CloudError(
            f"'{zone}' is not an AWS availability zone name", "use a name like us-east-1a"
        )
    return m.group(1)


class Clients:
    """Per-region boto3 clients sharing one session."""

    def __init__(self, settings: AwsSettings) -> None:
        self.settings = settings
        self._session: Any = None
        self._clients: dict[tuple[str, str, int], Any] = {}
        self._lock = threading.Lock()

    @property
    def session(self) -> Any:
        if self._session is None:
            import boto3

            try:
                self._session = (
                    boto3.Session(profile_name=self.settings.profile)
                    if self.settings.profile
                    else boto3.Session()
                )
            except Exception as exc:  # noqa: BLE001 - ProfileNotFound and friends
                raise translate(exc) from None
        return self._session

    def client(self, service: str, region: str, max_attempts: int | None = None) -> Any:
        """A client for ``service`` in ``region``; ``max_attempts`` overrides ``aws.max_attempts``
        (1 = no botocore retries, for calls whose errors the caller handles itself)."""
        attempts = max_attempts or self.settings.max_attempts
        key = (service, region, attempts)
        with self._lock:
            if key not in self._clients:
                from botocore.config import Config

                cfg = Config(
                    region_name=region,
                    retries={"mode": "standard", "total_max_attempts": attempts},
                    connect_timeout=10,
                    read_timeout=60,
                    user_agent_extra="aios-cloud-aws",
                )
                self._clients[key] = self.session.client(service, config=cfg)
            return self._clients[key]

    def credentials_source(self) -> str:
        """Where the credentials come from (``env``, ``shared-credentials-file``, ``sso``,
        ``iam-role`` ...) and the profile; never their value. Raises CredentialsError."""

        try:
            creds = self.session.get_credentials()
        except Exception as exc:  # noqa: BLE001
            raise translate(exc) from None
        if creds is None:
            raise CredentialsError("no AWS credentials found", NO_CREDENTIALS_FIX)
        method = getattr(creds, "method", "unknown")
        profile = self.settings.profile or self.session.profile_name
        return f"AWS {method}" + (
            f" (profile {profile})" if profile and profile != "default" else ""
        )
