"""The replica groups' goodput categories in ``aios report``: steps committed with fewer groups
than the run has, steps that did not commit (trained again), and each heal's time from the
group's restart to its first committed step. Each group's rank 0 keeps its counts in the run
record (``ft`` in ``diagnostics.json``; group g > 0 in ``group<g>/``)."""

from __future__ import annotations

import glob
import json
import os
from typing import Any


def summarize(run_dir: str) -> dict[str, Any] | None:
    """The run's replica-group account, or None for a run without replica groups."""
    groups: list[dict[str, Any]] = []
    for path in [
        os.path.join(run_dir, "diagnostics.json"),
        *sorted(glob.glob(os.path.join(run_dir, "group*", "diagnostics.json"))),
    ]:
        try:
            with open(path) as f:
                ft = json.load(f).get("ft")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(ft, dict):
            groups.append(ft)
    if not groups:
        return None
    return {
        "replica_groups": max(int(g.get("replica_groups") or 0) for g in groups),
        "steps_degraded": max(int(g.get("steps_degraded") or 0) for g in groups),
        "steps_lost": sum(int(g.get("steps_lost") or 0) for g in groups),
        "heals": [
            {"group": g.get("replica_group"), "seconds": g["heal_seconds"]}
            for g in groups
            if g.get("heal_seconds") is not None
        ],
    }


def lines(summary: dict[str, Any]) -> list[str]:
    heals = ", ".join(f"group {h['group']} in {h['seconds']:.1f}s" for h in summary["heals"])
    return [
        f"replica groups: {summary['replica_groups']}; steps committed with fewer groups: "
        f"{summary['steps_degraded']}; steps not committed (trained again): "
        f"{summary['steps_lost']}; heals: {heals or 'none'}"
    ]
