"""Launching: plans, the launcher <-> worker contract and the workers' side of it.

* :mod:`aios.launcher.plan`: launch plans shared by backends (``elastic_plan``; no torch).
* :mod:`aios.launcher.contract`: every ``AIOS_RUN_*`` environment variable in one place.
* :mod:`aios.launcher.worker`: workers never outlive their launcher.
* :mod:`aios.launcher.rewrites`: launch variables the script rewrote after the launcher set them.
* :mod:`aios.launcher.relay`: each rank's output relayed one whole line at a time.
* :mod:`aios.launcher.gloo`: letting gloo's worker threads finish before the interpreter ends.

``aios-run`` itself is :mod:`aios.cli.run`. Importing this package imports nothing.
"""
