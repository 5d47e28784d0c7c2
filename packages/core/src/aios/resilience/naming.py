"""What a run names at run time that reading the script cannot tell, each in one line:

* :func:`refuse_rewritten_launch_env`: the script rewrote the launcher's ``RANK``/
  ``WORLD_SIZE``/``MASTER_*`` (exit 2, at :func:`aios.init`);
* :func:`refuse_saves_without_dir`: the script calls ``save_best``/``save()`` but no
  ``checkpoint.dir`` is set (exit 2, at the first ``rt.setup``);
* :func:`name_placement`: the first backward's loss was computed off the rank's device, or in
  float16 on hardware without float16 speed (the run goes on);
* :func:`name_no_step`: the run ended without a single training step.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from aios.errors import ConfigError
from aios.launcher import guard, rewrites
from aios.resilience.preflight import needs_checkpoint_dir

if TYPE_CHECKING:
    import torch

    from aios.strategies.base import Strategy
    from aios.strategies.precision import Precision


def main_script() -> str | None:
    """The path of the script ``__main__`` runs, when it is a ``.py`` file."""
    main = sys.modules.get("__main__")
    path = main.__dict__.get("__file__") if main is not None else None
    return str(path) if path and str(path).endswith(".py") else None


def _script_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def refuse_rewritten_launch_env() -> None:
    """Under ``aios-run``: the script rewrote ``RANK``/``WORLD_SIZE``/``MASTER_*`` after the
    launcher set them (:mod:`aios.launcher.rewrites`). One line naming the first such write, with
    its ``file:line`` where the script's own file shows it; exit 2 before anything trains."""
    changed = rewrites.rewritten(os.environ, rewrites.initial_environ())
    if not changed:
        return
    name, was, now = changed[0]
    where, path = "", main_script()
    text = _script_text(path) if path is not None else None
    if path is not None and text is not None:
        line = rewrites.write_line(text, name)
        if line is not None:
            where = f"{os.path.basename(path)}:{line}: "
    also = ", ".join(n for n, _, _ in changed[1:])
    raise ConfigError(
        f"{where}the script set {name}={now} after aios-run set it to {was}"
        + (f" (and rewrote {also})" if also else "")
        + ": its ranks would not form the launcher's process group and would train as "
        "separate copies",
        f"remove the assignment: aios-run sets {', '.join(rewrites.LAUNCH_VARS)} for every rank",
    )


def refuse_saves_without_dir(checkpoint_dir: str | None) -> None:
    """The script (``__main__``) calls ``save_best``/``save()`` but ``checkpoint.dir`` is
    unset: one line now, not after the first epoch (:mod:`aios.resilience.preflight`)."""
    if checkpoint_dir:
        return
    path = main_script()
    text = _script_text(path) if path is not None else None
    if path is None or text is None:
        return
    found = needs_checkpoint_dir(text)
    if found is not None:
        line, call = found
        raise ConfigError(
            f"{os.path.basename(path)}:{line} calls {call}, which writes into "
            "checkpoint.dir, but none is set",
            "set checkpoint.dir=PATH (aios-run checkpoint.dir=ckpt ..., the config file, "
            "AIOS_CHECKPOINT__DIR or aios.init(defaults=...))",
        )


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def name_placement(
    loss: torch.Tensor,
    caller: Any,
    strategy: Strategy,
    precision: Precision,
    modules: list[torch.nn.Module],
) -> None:
    """At the first backward (on the first rank), what reading the script cannot tell: the
    forward ran on a device other than this rank's (the model or its inputs left on the host
    while the accelerator idles), or in float16 on an accelerator without fp16 speed. One line,
    with the ``file:line`` of the script's ``rt.backward`` (the frame ``caller``); the run goes
    on."""
    device = strategy.device
    if device is None:
        return
    where = f"{os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno}"
    if loss.device.type != device.type or (
        loss.device.index is not None
        and device.index is not None
        and loss.device.index != device.index
    ):
        on = ""
        for module in modules:
            for name, p in strategy.unwrap(module).named_parameters():
                if p.device.type == loss.device.type:
                    on = f" (the model's parameter {name!r} is on {p.device} too)"
                    break
        _say(
            f"aios: {where}: the loss was computed on {loss.device}, but this rank's device "
            f"is {device}{on}: the model or its inputs stayed off the device and the "
            "forward ran there; pass the model and loader through rt.setup (or move tensors "
            "with .to(rt.device))"
        )
        return
    if (
        str(loss.dtype) == "torch.float16"
        and not strategy.fp16_speed
        and precision.name != "fp16-mixed"
    ):
        _say(
            f"aios: {where}: the loss is float16, but {strategy.hardware} has no "
            "float16 speed (its fast type is bfloat16): drop the script's .half()/float16 "
            "casts and run with precision=bf16-mixed"
        )


def name_no_step(status: str, micro: int, step: int, loaded_step: int | None) -> None:
    """A run that ends on its own terms without a single training step (the script returned
    or called ``sys.exit`` after its own gate, e.g. "not enough GPUs") says so in one line;
    a run resumed at its last step, or preempted, does not."""
    if status not in ("finished", "exited") or micro or step or loaded_step is not None:
        return
    ended = guard.ended_at()
    where = f"{os.path.basename(ended[0])}:{ended[1]}: " if ended else ""
    how = "exited there" if ended else "ended"
    _say(
        f"aios: {where}the script {how} without a single training step (rt.backward "
        "never ran after aios.init): nothing was trained; see its last output above "
        "for why"
    )
