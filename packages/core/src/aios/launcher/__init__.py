"""Launching: plans, the launcher <-> worker contract and the workers' side of it.

* :mod:`aios.launcher.plan`: launch plans shared by backends (``elastic_plan``; no torch).
* :mod:`aios.launcher.contract`: every ``AIOS_RUN_*`` environment variable in one place.
* :mod:`aios.launcher.worker`: workers never outlive their launcher.
* :mod:`aios.launcher.rewrites`: launch variables the script rewrote after the launcher set them.
* :mod:`aios.launcher.relay`: each rank's output relayed one whole line at a time.
* :mod:`aios.launcher.gloo`: letting gloo's worker threads finish before the interpreter ends.

* :mod:`aios.launcher.warm`: ranks forked from a zygote that imported torch and aios once.
* :mod:`aios.launcher.supervise`: ``aios-run``'s run of a plan on this host (``execute``), over
  :mod:`~aios.launcher.agent` (torch's elastic agent in-process), :mod:`~aios.launcher.child`
  (one child process), :mod:`~aios.launcher.ports` and :mod:`~aios.launcher.outcome` (the exit
  status and its one line).

``aios-run``'s command line is :mod:`aios.cli.run` (arguments and plan:
:mod:`aios.cli.run_plan`). Importing this package imports nothing.
"""
