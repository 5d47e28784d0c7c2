"""Resilience: interruptions announced, hangs named, a script's needs read first.

* :mod:`aios.resilience.notices`: interruption notices, one model for every source
  (``PreemptionMonitor``, ``DeadlineWatcher``, ``FileWatcher``, ``effective_grace``).
* :mod:`aios.resilience.watchdog`: the hang watchdog (``Watchdog``, its policy, the sidecar).
* :mod:`aios.resilience.workers`: a rank's side of it (progress mapping, stack-dump file) and
  processes read through ``/proc``.
* :mod:`aios.resilience.stacks`: every rank's stacks collected and summarised (also ``aios stacks``).
* :mod:`aios.resilience.flightrec`: NCCL's Flight Recorder, read by the watchdog.
* :mod:`aios.resilience.preflight`: what a script will need, read from its source first.

Import from the modules; importing this package imports nothing (and never torch).
"""
