"""Resilience: interruptions announced, hangs named, a script's needs read first.

* :mod:`aios.resilience.notices`: interruption notices, one model for every source
  (``PreemptionMonitor``, ``DeadlineWatcher``, ``FileWatcher``, ``effective_grace``).
* :mod:`aios.resilience.watchdog`: the hang watchdog (``Watchdog``, the sidecar).
* :mod:`aios.resilience.flightrec`: NCCL's Flight Recorder, read by the watchdog.
* :mod:`aios.resilience.preflight`: what a script will need, read from its source first.

Import from the modules; importing this package imports nothing (and never torch).
"""
