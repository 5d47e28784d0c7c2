"""aios-backend-template: a complete, minimal third-party aios backend."""

__version__ = "0.1.0"
