"""A template aios cloud: a pool of SSH machines that ``aios launch --cloud pool`` leases."""

__version__ = "0.1.0"
