"""``gs://`` URLs through gcsfs: checkpoints (``save``/``load``/``resume``), data, ``aios sync``.

Credentials are gcsfs's own (Application Default Credentials / gcloud / the VM's service
account). ``STORAGE_EMULATOR_HOST`` (the variable Google's own clients honour) points it at a
local emulator with anonymous access.
"""

from __future__ import annotations

import os
from typing import Any


def storage_options(url: str) -> dict[str, Any]:
    host = os.environ.get("STORAGE_EMULATOR_HOST")
    if host:
        # the emulator speaks only the classic JSON API
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
        if not host.startswith("http"):
            host = f"http://{host}"
        return {"endpoint_url": host, "token": "anon"}
    project = os.environ.get("GOOGLE_CLOUD_PROJECT")
    return {"project": project} if project else {}
