"""Core's own notice source (a known end of the capacity the launcher computed ahead,
``AIOS_RUN_DEADLINE``), contributed by :mod:`aios.plugins.builtin` through
``aios_preemption_watchers``, passes the notice-source contract kit; the runtime gives it the
emergency checkpoint's lead."""

from __future__ import annotations

import os
import time

import pytest
from aios.launcher.contract import DEADLINE_ENV, DEADLINE_SOURCE_ENV
from aios.plugins.registry import get_registry, reset_registry
from aios.resilience.notices import DeadlineWatcher
from aios.testing.notice_source_contract import NoticeSourceContract


@pytest.fixture(autouse=True)
def no_platform(monkeypatch):
    for k in [k for k in os.environ if k.startswith("AIOS_")]:
        monkeypatch.delenv(k)


class TestKnownEnd(NoticeSourceContract):
    plugin = "aios-core"
    source = "capacity-block"

    @pytest.fixture
    def announce(self, monkeypatch):
        # the block ends within the default lead: due at once
        monkeypatch.setenv(DEADLINE_ENV, str(time.time() + 30))
        monkeypatch.setenv(DEADLINE_SOURCE_ENV, "capacity-block")


def test_hook_aios_preemption_watchers_core_source_gets_the_runtimes_lead(tmp_path, monkeypatch):
    """core's ``aios_preemption_watchers`` answer is what the runtime starts, with its lead."""
    pytest.importorskip("torch")
    import aios

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(DEADLINE_ENV, str(time.time() + 86400))
    monkeypatch.setenv(DEADLINE_SOURCE_ENV, "queued-resource")
    reset_registry()
    rt = aios.init(logging={"run_dir": str(tmp_path / "runs"), "tensorboard": False})
    try:
        (known,) = [w for w in rt._watchers if isinstance(w, DeadlineWatcher)]
        assert known.source == "queued-resource" and known.lead == rt._notice_lead
        assert not rt.preemption.requested  # a day ahead: not due
        assert get_registry().call_all("aios_preemption_watchers", config=rt.config)
    finally:
        rt.close()
        reset_registry()
