"""Data: loaders sharded by data-parallel rank, their workers, and random state.

* :mod:`aios.data.loaders`: rank sharding with a resumable global position
  (``ResumableDistributedSampler``, ``shard_dataloader``, ``DeviceLoader``).
* :mod:`aios.data.workers`: loader worker processes leave preemption notices to their rank.
* :mod:`aios.data.rng`: a process's random-number state, captured and restored in one place.

Import from the modules; importing this package imports nothing (and never torch).
"""
