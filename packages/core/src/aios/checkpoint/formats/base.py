"""The base of every checkpoint format, :class:`CheckpointFormat`, with what a format gets to
save (:class:`SaveContext`) and the lookup of a format by name (:func:`get_format`). A module of
its own so that formats (``full``, ``dcp``, a plugin's) derive from it without importing the
manager.

Extension point: checkpoint formats
-----------------------------------
*How* the state is written is a :class:`CheckpointFormat`, chosen by the strategy's
``checkpoint_format`` attribute (default ``"full"``) from the formats the manager is handed
(``formats``: the registry's :attr:`~aios.plugins.registry.Registry.checkpoint_formats`, which
plugins fill through the ``aios_register_checkpoint_formats`` hook with a
:class:`aios.types.CheckpointFormatSpec`; core registers ``full`` and ``dcp`` in
:mod:`aios.plugins.builtin`; prove one with
:class:`aios.testing.checkpoint_format_contract.CheckpointFormatContract`). A format
implements:

* ``save(step, ctx, staging, store)``: write this rank's files into ``staging.path`` with
  ``store.write_file(staging, name, writer)`` (durable, sized and hashed for the marker) or on its
  own (then return ``{name: {"size": n}}`` entries). ``ctx`` is a :class:`SaveContext`: the
  :class:`aios.checkpoint.state.TrainingState` (models, optimizers, ... for a sharded writer), ``extra``,
  and ``full_state()`` (the whole state dict with every rank's RNG state).
* ``load(info, store, target, rank)``: restore ``target`` (the training state) from the
  checkpoint ``info``; return the saved ``extra`` dict.
* ``all_ranks_write``: whether every rank writes files (sharded formats, e.g. DCP). Then the
  manager broadcasts the staging directory rank 0 began, gathers every rank's file entries,
  and rank 0 commits after a barrier, i.e. after every rank's files are durable.
* ``supports_resharding``: whether a checkpoint written with another world size (or strategy)
  can be loaded into this run's sharding (DCP). Resume at another shape is the default
  (``checkpoint.reshard``, true unless set false): a checkpoint is read by the format that wrote
  it (:meth:`aios.checkpoint.manager.CheckpointManager._format_for`), so a ``full`` one loads
  under a sharded strategy and a ``dcp`` one under ddp/xla; with ``reshard=false`` a mismatch in
  world size, backend, strategy or format is a one-line error naming it and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from aios.errors import CheckpointError

if TYPE_CHECKING:
    from aios.types import CheckpointFormatSpec


class CheckpointFormat:
    """How training state becomes files in a staging directory (see the module docstring)."""

    name = "base"
    #: a checkpoint written at one world size can be loaded at another
    supports_resharding = False
    #: every rank writes its own files (else only the rank(s) where ``saves_on_this_rank()``)
    all_ranks_write = False

    def save(self, step: int, ctx: Any, staging: Any, store: Any) -> dict[str, Any]:
        raise NotImplementedError

    def load(
        self, info: Any, store: Any, target: Any, rank: int = 0, strict: bool = True
    ) -> dict[str, Any]:
        raise NotImplementedError


class SaveContext:
    """What a :class:`CheckpointFormat` gets to save."""

    def __init__(
        self, training: Any, extra: dict[str, Any], rngs: list[Any], background: bool = False
    ) -> None:
        self.training = training
        self.extra = extra
        #: every rank's RNG state (gathered before the save; rank order)
        self.rngs = rngs
        #: the format may write in the background (formats with ``wait()``; the manager then
        #: defers the commit to ``commit_when_written`` and finishes it with ``wait()``)
        self.background = background

    def full_state(self) -> dict[str, Any]:
        """The full state dict of this process plus every rank's RNG state and ``extra``."""
        state = self.training.state_dict()
        state["rng"] = self.rngs
        state["extra"] = self.extra
        return state


def get_format(name: str, formats: Mapping[str, CheckpointFormatSpec]) -> CheckpointFormat:
    """A new format ``name`` from ``formats`` (the registry's checkpoint formats)."""
    spec = formats.get(name)
    if spec is None:
        raise CheckpointError(
            f"checkpoint format '{name}' is not available (known: {', '.join(sorted(formats))})",
            "install the plugin that provides it",
        )
    fmt: CheckpointFormat = spec.factory()
    return fmt


__all__ = ["CheckpointFormat", "SaveContext", "get_format"]
