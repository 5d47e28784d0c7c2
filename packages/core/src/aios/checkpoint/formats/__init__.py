"""Checkpoint formats.

* :mod:`aios.checkpoint.formats.base`: :class:`CheckpointFormat`, the base every format derives
  from (core's ``full`` and ``dcp``, a plugin's), :class:`SaveContext` and ``get_format``;
* :mod:`aios.checkpoint.formats.full`: the ``full`` format (one ``state.pt``);
* :mod:`aios.checkpoint.formats.dcp`: the ``dcp`` format (torch.distributed.checkpoint shards,
  resharding on load, background writes): its writer and library API; the manager's format in
  :mod:`aios.checkpoint.formats.dcp_format`, the storage side (URLs, digests) in
  :mod:`aios.checkpoint.formats.dcp_io`, DCP's checkpoint process in
  :mod:`aios.checkpoint.formats.dcp_process`.

Importing this package imports nothing.
"""
