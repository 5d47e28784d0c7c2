"""A checkpoint written at another shape than this run's (world size, data-parallel ranks,
strategy, backend, format): the refusal under ``checkpoint.reshard=false``
(:func:`refuse_other_shape`), and what changed, in words, for the line a resume prints
(:func:`shape_change`, :func:`batch_change`)."""

from __future__ import annotations

from typing import Any

from aios.errors import CheckpointError


def _strategy_word(name: Any) -> str:
    """``DDPStrategy`` -> ``ddp``, ``FSDPStrategy`` -> ``fsdp`` (a marker records class names)."""
    text = str(name)
    return text[: -len("Strategy")].lower() if text.endswith("Strategy") else text


def refuse_other_shape(info: Any, store: Any, mine: dict[str, Any], reshard: bool) -> None:
    """With ``reshard`` (``checkpoint.reshard``, on by default) a checkpoint written at
    another shape (world size, mesh, strategy, backend, format) is accepted: sharded ones
    reshard through DCP, full ones load everywhere. With ``reshard=false`` any difference is
    refused in one line naming it and the fix."""
    if reshard:
        return
    meta = info.meta
    where = (
        f"checkpoint '{store.display(info.path)}' (run {meta.get('run_id', '?')}, step {info.step})"
    )
    fix = (
        "relaunch with the shape that wrote it, allow resuming at another shape with "
        "checkpoint.reshard=true, or start fresh with checkpoint.resume=false (or another "
        "checkpoint.dir)"
    )
    fmt = meta.get("checkpoint_format", "full")
    if fmt != mine["checkpoint_format"]:
        raise CheckpointError(
            f"{where} was written in the '{fmt}' format; this run's strategy "
            f"({mine['strategy']}) uses '{mine['checkpoint_format']}' and checkpoint.reshard=false",
            fix,
        )
    if "backend" in meta and meta["backend"] != mine["backend"]:
        raise CheckpointError(
            f"{where} was written by backend '{meta['backend']}', this run uses "
            f"'{mine['backend']}' and checkpoint.reshard=false",
            fix,
        )
    if "strategy" in meta and meta["strategy"] != mine["strategy"]:
        raise CheckpointError(
            f"{where} was written by strategy {meta['strategy']}, this run uses "
            f"{mine['strategy']} and checkpoint.reshard=false",
            fix,
        )
    if "world_size" in meta and int(meta["world_size"]) != mine["world_size"]:
        raise CheckpointError(
            f"{where} was written with world size {meta['world_size']}, this run has "
            f"world size {mine['world_size']} and checkpoint.reshard=false",
            f"relaunch with {meta['world_size']} processes in total, allow resuming at "
            "another shape with checkpoint.reshard=true, or start fresh with "
            "checkpoint.resume=false (or another checkpoint.dir)",
        )


def shape_change(meta: dict[str, Any], mine: dict[str, Any]) -> list[str]:
    """What differs between the shape that wrote a checkpoint (its marker's ``meta``) and
    this run's (``mine``: :meth:`CheckpointManager.meta`), in words (empty at the same
    shape)."""
    out: list[str] = []
    if "world_size" in meta and int(meta["world_size"]) != mine["world_size"]:
        n = mine["world_size"]
        out.append(f"{meta['world_size']} -> {n} process{'es' if n != 1 else ''}")
    for key in ("strategy", "backend"):
        if key in meta and meta[key] != mine[key]:
            old, new = meta[key], mine[key]
            if key == "strategy":
                old, new = _strategy_word(old), _strategy_word(new)
            out.append(f"{key} {old} -> {new}")
    if (
        "data_world" in meta
        and int(meta["data_world"]) != mine["data_world"]
        and int(meta.get("world_size", 0)) == mine["world_size"]
    ):
        out.append(f"data-parallel ranks {meta['data_world']} -> {mine['data_world']}")
    return out


def batch_change(
    meta: dict[str, Any], mine_meta: dict[str, Any], mine: dict[str, Any], config: Any
) -> str | None:
    """How the batch arithmetic carried over (None when nothing about it changed); ``mine``
    is this run's :meth:`CheckpointManager.batch_shape`, ``mine_meta`` its ``meta``."""
    old_g, new_g = meta.get("global_batch"), mine.get("global_batch")
    old_a, new_a = meta.get("grad_accum"), mine["grad_accum"]
    accum = f" (grad_accum {old_a} -> {new_a})" if old_a and old_a != new_a else ""
    if old_g is None or new_g is None:
        return f"grad_accum {old_a} -> {new_a}" if accum else None
    if old_g == new_g:
        return (
            f"global batch {new_g} kept{accum}" if accum or shape_change(meta, mine_meta) else None
        )
    fix = (
        ""
        if getattr(config, "global_batch", None) is not None
        else "; set global_batch and micro_batch to keep it"
    )
    return (
        f"the global batch is now {new_g}, was {old_g} (micro-batch {mine.get('micro_batch')} "
        f"x {mine['data_world']} data-parallel ranks x grad_accum {new_a}){fix}"
    )
