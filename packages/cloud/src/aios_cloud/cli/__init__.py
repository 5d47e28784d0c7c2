"""The cloud commands: ``aios launch|status|exec|logs|ssh|sync|stop|start|down|catalog|cost``,
one module per command group:

* :mod:`aios_cloud.cli.launch`: ``aios launch``;
* :mod:`aios_cloud.cli.status`: ``aios status``;
* :mod:`aios_cloud.cli.remote`: ``aios exec``, ``aios logs``, ``aios ssh``;
* :mod:`aios_cloud.cli.sync`: ``aios sync``;
* :mod:`aios_cloud.cli.lifecycle`: ``aios stop``, ``start``, ``down``, ``autostop``, ``cancel``;
* :mod:`aios_cloud.cli.prices`: ``aios catalog``, ``aios cost``;
* :mod:`aios_cloud.cli.common`: what they share.

They work with any installed cloud plugin (``aios-cloud-gcp``, ``aios-cloud-aws``, third-party)
through :class:`aios_cloud.CloudProvider`. ``--dry-run`` on every command prints the equivalent
cloud CLI commands and per-worker commands and touches nothing (no cloud call, no SSH, no state
written). No torch import on any of these paths. The ``aios-cloud`` plugin
(:mod:`aios_cloud.plugin`) names each command by ``module:attribute``; this package imports
none of them, so that running one command imports only its own module.
"""
