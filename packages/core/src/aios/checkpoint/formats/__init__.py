"""Checkpoint formats beside the full ``state.pt`` one (which the manager holds).

* :mod:`aios.checkpoint.formats.base`: :class:`CheckpointFormat`, the base every format derives
  from (core's ``full`` in the manager, ``dcp``, a plugin's);
* :mod:`aios.checkpoint.formats.dcp`: the ``dcp`` format (torch.distributed.checkpoint shards,
  resharding on load, background writes).

Importing this package imports nothing.
"""
