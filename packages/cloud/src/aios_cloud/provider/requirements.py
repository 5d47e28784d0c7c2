"""Setup requirements checked before they reach a host: no ``aios*`` name from the public
registry (those belong to unrelated projects)."""

from __future__ import annotations

import re

from aios_cloud.provider.errors import CloudError

# ------------------------------------------------------------------------------ requirements

# ``aios``, ``aios-core[aws]``, ``aios_cloud_gcp>=1``: names on the public registry that belong to
# unrelated projects. Hosts get aios from the synced checkout (the bundle), never from there.
_AIOS_REQ = re.compile(
    r"^\s*aios(?:[-_.][A-Za-z0-9_.-]*)?\s*(?:\[[^\]]*\])?\s*(?:[<>=!~;@].*)?$", re.IGNORECASE
)


def registry_aios(requirement: str) -> bool:
    """Whether ``requirement`` would fetch an ``aios*`` distribution from a package index (a
    local path or a URL to a wheel built from the checkout is fine)."""
    r = requirement.strip()
    if (
        not r
        or r.startswith(("-", ".", "/", "~"))
        or "://" in r.split("@", 1)[0]
        or r.endswith(".whl")
    ):
        return False
    if "@" in r and ("file:" in r or "://" in r):
        return False
    return bool(_AIOS_REQ.match(r))


def check_requirements(
    requirements: list[str] | tuple[str, ...], where: str = "setup requirements"
) -> None:
    """Refuse an ``aios*`` requirement that would come from the public registry."""
    for r in requirements:
        if registry_aios(r):
            raise CloudError(
                f"{where} ask for '{r.strip()}' from the package registry, where that name "
                "belongs to an unrelated project",
                "drop it: aios is shipped to the hosts with the synced code (or list a wheel "
                "path built from your checkout)",
            )
