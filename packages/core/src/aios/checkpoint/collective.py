"""The collectives of the checkpoint manager: a decision rank 0 takes that every rank gets
(:func:`on_rank0`), the end of a save where every rank learns every rank's outcome
(:func:`settle_all`), and the least time any rank has before its notice's deadline
(:func:`least_time_left`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aios.errors import PeerFailed, outcome, settle

if TYPE_CHECKING:
    from aios.strategies.base import Strategy


def on_rank0(
    strategy: Strategy,
    world_size: int,
    fn: Callable[[], Any],
    what: str = "the checkpoint operation",
) -> Any:
    """Run ``fn`` on rank 0; every rank gets its result. When it fails, rank 0 raises the
    error and the other ranks a quiet :class:`aios.errors.PeerFailed` (one line in all)."""
    result = error = None
    if strategy.rank == 0:
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 - re-raised below, after every rank knows
            error = exc
    mine = outcome(error)
    if world_size > 1:
        result, mine = strategy.broadcast_object((result, mine), 0)
    if error is not None:
        raise error
    if mine is not None:
        raise PeerFailed(f"{what} failed on rank 0 ({mine[1]})")
    return result


def settle_all(strategy: Strategy, world_size: int, error: BaseException | None, what: str) -> None:
    """Collective end of a save: every rank learns every rank's outcome, so a failure on
    one rank stops every rank (one line, from the rank where it happened; the others stop
    quietly) instead of leaving them to die at their next collective."""
    mine = outcome(error)
    outcomes = strategy.gather_object(mine) if world_size > 1 else [mine]
    if error is not None and not isinstance(error, Exception):
        raise error  # KeyboardInterrupt, SystemExit: as they are
    settle(outcomes, strategy.rank, error, what)


def least_time_left(
    strategy: Strategy, world_size: int, time_left: Callable[[], float | None]
) -> float | None:
    """Collective: the least time any rank has before its notice's deadline
    (``time_left()``: this rank's, None without one)."""
    mine = time_left()
    gather = getattr(strategy, "gather_object", None)
    lefts = gather(mine) if world_size > 1 and gather is not None else [mine]
    known = [x for x in lefts if x is not None]
    return min(known) if known else None
