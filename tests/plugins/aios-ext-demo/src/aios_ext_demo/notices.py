"""Notice source ``demo-reclaim``: the demo platform announces that it takes the host back by
creating the file ``DEMO_RECLAIM_FILE`` names (the host is gone a minute later)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from aios.types import Notice, PreemptionWatcher

ENV = "DEMO_RECLAIM_FILE"


class ReclaimWatcher(PreemptionWatcher):
    name = "demo-reclaim"

    def __init__(self, path: str, interval: float = 0.05) -> None:
        self.path = path
        self.interval = interval
        self._stop = threading.Event()

    def start(self, notify: Callable[[Notice | str], None]) -> None:
        def poll() -> None:
            while not self._stop.is_set():
                if os.path.exists(self.path):
                    notify(
                        Notice(
                            "demo-reclaim",
                            "the demo platform reclaims this host",
                            time.time() + 60.0,
                        )
                    )
                    return
                self._stop.wait(self.interval)

        threading.Thread(target=poll, name="demo-reclaim", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()


def watchers() -> list[PreemptionWatcher] | None:
    """A watcher on the demo platform (``DEMO_RECLAIM_FILE`` set), none elsewhere."""
    path = os.environ.get(ENV)
    return [ReclaimWatcher(path)] if path else None
