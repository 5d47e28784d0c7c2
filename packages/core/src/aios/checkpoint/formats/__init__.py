"""Checkpoint formats.

* :mod:`aios.checkpoint.formats.base`: :class:`CheckpointFormat`, the base every format derives
  from (core's ``full`` and ``dcp``, a plugin's), :class:`SaveContext` and ``get_format``;
* :mod:`aios.checkpoint.formats.full`: the ``full`` format (one ``state.pt``);
* :mod:`aios.checkpoint.formats.dcp`: the ``dcp`` format (torch.distributed.checkpoint shards,
  resharding on load, background writes).

Importing this package imports nothing.
"""
