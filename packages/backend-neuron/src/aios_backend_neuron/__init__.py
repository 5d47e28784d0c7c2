"""aios backend for AWS Trainium. Importing this package is cheap (no torch)."""

from aios_backend_neuron.__about__ import __version__

__all__ = ["__version__"]
