"""Slurm job states and job names (shared by the provider and the launch)."""

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


__all__ = ["FINAL_STATES", "NAME_RE", "default_name"]
