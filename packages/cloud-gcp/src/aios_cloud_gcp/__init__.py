"""aios-cloud-gcp: Cloud TPU VMs and pod slices for ``aios launch --cloud gcp``, and ``gs://``
storage. Importing this package is cheap (no google libraries)."""

from aios_cloud_gcp.__about__ import __version__

__all__ = ["__version__"]
