"""The ``aios`` and ``aios-run`` command lines. Importing this package never imports torch."""
