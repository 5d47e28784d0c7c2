"""`aios cancel` is one command (it was once defined twice and the later definition hid the
scheduler path and its --config option)."""

from __future__ import annotations


def test_cancel_keeps_the_scheduler_option():
    from aios_cloud.cli import lifecycle

    names = {p.name for p in lifecycle.cancel.params}
    assert {"name", "job_id", "config_file"} <= names
    assert sum(1 for line in open(lifecycle.__file__) if line.startswith("def cancel(")) == 1
