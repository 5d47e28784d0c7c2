"""Run records: what a run did and what its time went to.

* :mod:`aios.runrecord.records`: ``<logging.run_dir>/<run-id>/`` written by rank 0
  (``RunRecord``, ``StepTimer``).
* :mod:`aios.runrecord.goodput`: goodput over every attempt, restart and recovery
  (``write_event``, ``read_attempts``, ``account``, ``report_for``).
* :mod:`aios.runrecord.render`: the report as text lines and one HTML page (``render_text``,
  ``render_html``).
* :mod:`aios.runrecord.loggers`: the metric loggers of the built-in plugin.

Import from the modules; importing this package imports nothing (and never torch).
"""
