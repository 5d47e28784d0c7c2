"""Times as EC2 gives them (botocore datetimes, ISO 8601 strings) and as aios prints them: a leaf
module, imported by the offerings, the instances and the provider alike."""

from __future__ import annotations

import time
from typing import Any


def epoch(value: Any) -> float | None:
    """Epoch seconds of a botocore datetime or an ISO 8601 string (``None`` when absent)."""
    if value is None:
        return None
    if hasattr(value, "timestamp"):
        return float(value.timestamp())
    from datetime import datetime

    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
