"""A contract kit for notice sources (the ``aios_preemption_watchers`` hook): subclass
:class:`NoticeSourceContract` to prove a source, first-party or third-party, through the
registry the way a run finds it.

    from aios.testing.notice_source_contract import NoticeSourceContract

    class TestMySource(NoticeSourceContract):
        plugin = "my-plugin"              # its entry-point name
        source = "my-cloud-reclaim"       # the Notice.source it gives

        @pytest.fixture
        def announce(self, my_stand_in, monkeypatch):
            ...                           # the platform is there and announces an interruption

What it checks (the config is aios's resolved default; ``absent`` clears the platform, by
default nothing):

* without the platform the plugin contributes no watcher (a source never fires off its
  platform);
* with it, the plugin's ``aios_preemption_watchers(config)`` gives
  :class:`aios.types.PreemptionWatcher` instances; started, they call ``notify`` once with an
  :class:`aios.types.Notice` whose ``source`` is :attr:`source`, with a one-line reason and a
  wall-clock deadline or ``None``; ``stop()`` returns.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from aios.config.schema import resolve
from aios.plugins.registry import get_registry, reset_registry
from aios.types import Notice, PreemptionWatcher

#: the most a source may take to announce once its platform did (an upper bound only: a
#: source that announces sooner passes at once)
ANNOUNCE_WITHIN = 60.0


class NoticeSourceContract:
    """Subclass it, name :attr:`plugin` and :attr:`source`, provide ``announce``."""

    plugin: ClassVar[str] = ""
    source: ClassVar[str] = ""

    @pytest.fixture
    def announce(self) -> Any:
        raise NotImplementedError("provide an `announce` fixture: the platform announces")

    @pytest.fixture
    def absent(self) -> Any:
        """The platform is not there (default: nothing to clear)."""
        return None

    @pytest.fixture
    def fresh_registry(self) -> Iterator[None]:
        reset_registry()
        yield
        reset_registry()

    def watchers(self) -> list[Any]:
        """What :attr:`plugin` answers ``aios_preemption_watchers`` with, through the registry."""
        config = resolve(check_backend=False)
        out: list[Any] = []
        for plugin, result, exc in get_registry().call_all(
            "aios_preemption_watchers", config=config
        ):
            if plugin == self.plugin:
                assert exc is None, f"{plugin} raised: {exc}"
                out.extend(result or [])
        return out

    def test_no_watcher_without_the_platform(self, fresh_registry: None, absent: Any) -> None:
        assert self.watchers() == []

    def test_a_notice_arrives_once_with_its_source(
        self, fresh_registry: None, announce: Any
    ) -> None:
        watchers = self.watchers()
        assert watchers, f"{self.plugin} gave no watcher where its platform announces"
        assert all(isinstance(w, PreemptionWatcher) for w in watchers)
        got: list[Notice | str] = []
        heard = threading.Event()

        def notify(notice: Notice | str) -> None:
            got.append(notice)
            heard.set()

        for w in watchers:
            w.start(notify)
        try:
            assert heard.wait(ANNOUNCE_WITHIN), f"no notice within {ANNOUNCE_WITHIN:g}s"
        finally:
            for w in watchers:
                w.stop()
        notice = got[0]
        assert isinstance(notice, Notice), notice
        assert notice.source == self.source
        assert notice.reason and "\n" not in notice.reason
        assert notice.deadline is None or isinstance(notice.deadline, float)
        assert len(got) == 1, got


__all__ = ["ANNOUNCE_WITHIN", "NoticeSourceContract"]
