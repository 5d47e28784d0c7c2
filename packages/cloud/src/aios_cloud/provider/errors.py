"""The errors a cloud raises: one line naming the problem and the fix; the failover reads
their kind (stockout, quota, unavailable)."""

from __future__ import annotations

from typing import Literal

from aios.errors import AiosError

# ------------------------------------------------------------------------------ errors


class CloudError(AiosError):
    """A cloud operation failed (one line; the fix says what to do)."""


class CapacityError(CloudError):
    """The zone has no capacity for the type now (GCE ``RESOURCE_EXHAUSTED``/stockout, EC2
    ``InsufficientInstanceCapacity``). The core fails over to the next zone."""


class QuotaError(CloudError):
    """The project/account quota does not cover the request. The core fails over to the next
    zone (quotas are regional) and reports the quota when every zone failed."""


class NotOfferedError(CloudError):
    """The zone does not offer the type (GCE ``INVALID_ARGUMENT`` "accelerator type not
    available in zone", EC2 ``Unsupported``). The core moves on to the next zone."""


class CredentialsError(CloudError):
    """No usable credentials (ADC, gcloud, AWS profile)."""


class ClusterNotFound(CloudError):
    """The named cluster does not exist (in the store or in the cloud)."""


FailureKind = Literal["stockout", "quota", "unavailable", "transient", "fatal"]
