"""What Slurm says, read: job states, job names, ``scontrol``/``sinfo`` output (shared by the
provider and the launch)."""

from __future__ import annotations

import getpass
import random
import re

FINAL_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
}
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,46}[a-z0-9])?$")


def default_name() -> str:
    user = re.sub("[^a-z0-9]", "", getpass.getuser().lower())[:12] or "user"
    return f"aios-{user}-{random.randint(0, 0xFFFF):04x}"


def parse_kv(line: str) -> dict[str, str]:
    """``scontrol show job -o`` output: ``Key=Value`` pairs separated by spaces."""
    out: dict[str, str] = {}
    for tok in line.split():
        k, eq, v = tok.partition("=")
        if eq:
            out[k] = v
    return out


def gres_gpus(gres: str | None) -> int:
    """GPUs per node in ``sinfo %G`` text (``gpu:8``, ``gpu:a100:8(S:0-1)``, ``gpu:a100:4,gpu:v100:2``
    counts 6); 0 when the nodes declare none."""
    return sum(int(m.group(1)) for m in re.finditer(r"(?:^|,)gpu(?::[^:(,]+)?:(\d+)", gres or ""))


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config`` output: ``Key = Value`` lines."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        k, eq, v = line.partition("=")
        if eq and k.strip() and " " not in k.strip():
            out[k.strip()] = v.strip()
    return out


__all__ = ["FINAL_STATES", "NAME_RE", "default_name", "gres_gpus", "parse_config", "parse_kv"]
