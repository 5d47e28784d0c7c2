"""Cloud TPU VMs and pod slices through the Cloud TPU API v2 (``google-cloud-tpu``, REST).

* create: a node (on demand or spot) or a queued resource (waits for capacity, optional time
  window), with aios's SSH public key in the ``ssh-keys`` metadata and ``aios-cluster`` labels;
* describe / list / start / stop / delete (a queued resource is deleted with ``force``, which
  takes its node with it);
* runtime version per generation from :mod:`aios_backend_xla.topology` (v6e ``v2-alpha-tpuv6e``,
  v5e ``v2-alpha-tpuv5-lite``, v5p ``v2-alpha-tpuv5``, v4 ``tpu-ubuntu2204-base``);
* errors classified for the core's zone failover: ``RESOURCE_EXHAUSTED`` without "quota" is a
  stockout, with "quota" a quota error, ``UNAVAILABLE``/``INTERNAL``/``DEADLINE_EXCEEDED``
  transient;
* credentials from Application Default Credentials, else ``gcloud auth print-access-token``;
  nothing secret is stored; ``gcp.credentials=anonymous`` for local test services.

Every method has a ``gcloud`` rendering for ``--dry-run``.

Laid out by job: :mod:`~aios_cloud_gcp.base` (project, credentials, client, errors),
:mod:`~aios_cloud_gcp.offerings` (catalog, validation, the create plan),
:mod:`~aios_cloud_gcp.access` (OS Login, IAM), :mod:`~aios_cloud_gcp.dryrun`,
:mod:`~aios_cloud_gcp.instances` (lifecycle); this module adds the hosts' runtime.
"""

from __future__ import annotations

import shlex
from typing import Any

from aios.plugins.versions import STACKS
from aios_cloud.provider.data import ClusterInfo
from aios_cloud.provider.requirements import check_requirements

from aios_cloud_gcp.base import (  # noqa: F401  (their old home)
    LIBTPU_INDEXES,
    ROLE_PERMISSIONS,
    TORCH_TPU_PYTHON,
    TORCH_TPU_VENV,
    CreatePlan,
    TransientCloudError,
    has_permission,
)
from aios_cloud_gcp.instances import GcpInstances


class GcpProvider(GcpInstances):
    """Cloud TPU provider. ``config``: the resolved aios config (its ``gcp`` section is read)."""

    def controller_settings(self) -> dict[str, Any]:
        d = self.settings.model_dump(exclude_none=True)
        d.update(self.agent_settings())
        return d

    def agent_settings(self) -> dict[str, Any]:
        s = self.settings
        out: dict[str, Any] = {"project": self.project(), "poll_interval": s.poll_interval}
        endpoint = s.agent_endpoint or s.endpoint
        if endpoint:
            out["endpoint"] = endpoint
        # on a TPU VM: its service account (ADC through the metadata server); a local test
        # service takes anonymous calls
        out["credentials"] = "anonymous" if s.credentials == "anonymous" else "adc"
        return out

    # -------------------------------------------------------------- runtime on the hosts
    def python(self, accelerator: str, backend: str | None = None) -> str:
        """``python3`` of the TPU VM image for torch_xla; for TorchTPU (``--backend tpu``) the
        venv :meth:`setup_commands` makes, since the image's Python is 3.10 and torch_tpu has
        cp311/cp312 wheels only."""
        if (backend or self.backend_for(accelerator)) == "tpu":
            return f"{TORCH_TPU_VENV}/bin/python"
        return "python3"

    def setup_commands(
        self, accelerator: str, requirements: list[str], backend: str | None = None
    ) -> list[str]:
        lines = ["python3 -m pip install --quiet --upgrade pip"]
        py = "python3"
        if (backend or self.backend_for(accelerator)) == "tpu":
            # TorchTPU: the torch / torch_tpu / libtpu set of aios.plugins.versions (one fact, one place);
            # torch_xla is not installed (it would pin another torch). The runtime images are
            # Ubuntu 22.04 with Python 3.10 and torch_tpu ships cp311/cp312 wheels only, so it
            # goes into a Python 3.12 venv made by uv, which downloads a managed CPython
            # (https://docs.astral.sh/uv/concepts/python-versions/#automatic-python-downloads);
            # never into the image's python3.

            py = f"{TORCH_TPU_VENV}/bin/python"
            install = STACKS["torch_tpu"][0].install
            lines += [
                "python3 -m pip install --quiet uv",
                f"python3 -m uv venv --allow-existing --seed --python {TORCH_TPU_PYTHON} "
                f"{TORCH_TPU_VENV}",
                f"{py} -m pip install --quiet " + install.removeprefix("pip install "),
            ]
        else:
            v = self.settings.torch_version
            minor = ".".join(v.split(".")[:2])
            finds = " ".join(f"-f {u}" for u in LIBTPU_INDEXES)
            # torch and torch_xla must match; torch_xla[tpu] pins the matching libtpu wheel.
            lines.append(
                f"python3 -m pip install --quiet 'torch~={minor}.0' 'torch_xla[tpu]~={minor}.0' {finds}"
            )
        aios_deps = [r for r in self.settings.aios_requirements if r]
        check_requirements(aios_deps, "aios_requirements")
        check_requirements(requirements)
        if aios_deps:
            lines.append(
                f"{py} -m pip install --quiet " + " ".join(shlex.quote(r) for r in aios_deps)
            )
        if requirements:
            lines.append(
                f"{py} -m pip install --quiet " + " ".join(shlex.quote(r) for r in requirements)
            )
        return lines

    def remote_env(self, info: ClusterInfo) -> dict[str, str]:
        # PJRT_DEVICE and the per-host worker env come from backend-xla's launch plan; this is
        # what only the cloud side knows.
        return {"TPU_ACCELERATOR_TYPE": info.accelerator} if info.accelerator else {}
