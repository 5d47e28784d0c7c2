"""Plugins: how aios is extended, and what it knows about the packages that extend it.

* :mod:`aios.plugins.hookspecs`: every ``aios_*`` hook specification, documented with its
  signature (the one extension mechanism).
* :mod:`aios.plugins.registry`: the registry over the ``aios`` entry-point group (lazy, once,
  each plugin isolated): :class:`~aios.plugins.registry.Registry`, ``get_registry``.
* :mod:`aios.plugins.builtin`: the built-in plugin (entry point ``aios-core``): CPU backend,
  native strategies, cluster environments, loggers, storage.
* :mod:`aios.plugins.install_hints`: how to install a first-party plugin that is missing.
* :mod:`aios.plugins.reserved`: the commands and config keys core reserves.
* :mod:`aios.plugins.versions`: the compatible version sets of the accelerator stacks.

Import from the modules; importing this package imports nothing (and never torch).
"""
