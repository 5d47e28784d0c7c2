"""aios backend for NVIDIA GPUs. Importing this package is cheap (no torch, no NVML init)."""

from aios_backend_cuda.__about__ import __version__

__all__ = ["__version__"]
