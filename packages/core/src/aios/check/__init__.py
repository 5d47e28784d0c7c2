"""``aios check``: what ties a training script to one accelerator, found statically.

* :mod:`aios.check.checker`: ``check_file``, ``check_source``, ``fix_source``, ``Finding``.

The command is :mod:`aios.cli.check`. Importing this package imports nothing (never torch).
"""
