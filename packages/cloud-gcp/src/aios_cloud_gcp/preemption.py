"""GCE preemption notices: the metadata key ``instance/preempted`` turns ``TRUE`` about 30 s
before a spot/preemptible TPU VM is reclaimed. The watcher long-polls it
(``?wait_for_change=true``) in a daemon thread and calls ``notify`` once; the runtime then takes
its emergency checkpoint exactly as for SIGTERM.

Active only on GCE (``/sys/class/dmi/id/product_name`` says Google) or when ``GCE_METADATA_HOST``
points at a metadata server (the variable google-auth honours; tests set it).
"""

from __future__ import annotations

import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from aios.types import PreemptionWatcher

DMI = Path("/sys/class/dmi/id/product_name")


def on_gce() -> bool:
    if os.environ.get("GCE_METADATA_HOST"):
        return True
    try:
        return "Google" in DMI.read_text()
    except OSError:
        return False


def metadata_host() -> str:
    return os.environ.get("GCE_METADATA_HOST") or "metadata.google.internal"


class GcePreemptionWatcher(PreemptionWatcher):
    name = "gce-metadata"

    def __init__(self, host: str | None = None, timeout: float = 60.0, retry: float = 2.0) -> None:
        self.host = host or metadata_host()
        self.timeout = timeout
        self.retry = retry
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _get(self, wait: bool) -> str:
        url = f"http://{self.host}/computeMetadata/v1/instance/preempted"
        if wait:
            url += f"?wait_for_change=true&timeout_sec={int(self.timeout)}"
        req = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
        with urllib.request.urlopen(req, timeout=self.timeout + 5) as r:
            return r.read().decode().strip()

    def start(self, notify: Callable[[str], None]) -> None:
        def loop() -> None:
            wait = False
            while not self._stop.is_set():
                try:
                    if self._get(wait).upper() == "TRUE":
                        notify("GCE preemption notice (metadata instance/preempted=TRUE)")
                        return
                    wait = True
                except (urllib.error.URLError, OSError, ValueError):
                    wait = False
                    self._stop.wait(self.retry)

        self._thread = threading.Thread(target=loop, name="aios-gce-preempted", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
