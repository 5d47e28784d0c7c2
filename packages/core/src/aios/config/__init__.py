"""Configuration: one validated schema, and what of it is secret.

* :mod:`aios.config.schema`: the pydantic schema, the settings sections, and ``resolve``
  (defaults < YAML < ``AIOS_*`` environment < ``key=value`` overrides).
* :mod:`aios.config.redact`: the one place that decides what is a secret and hides it.

Import from the modules; importing this package imports nothing.
"""
