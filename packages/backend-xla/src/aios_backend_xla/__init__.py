"""aios-backend-xla: Google Cloud TPUs through torch_xla (PJRT) for aios.

Importing this package is cheap: torch and torch_xla are imported only inside the functions
that train (``aios_backend_xla.strategy``, ``aios_backend_xla.launcher``).
"""

from aios_backend_xla.__about__ import __version__

__all__ = ["__version__"]
