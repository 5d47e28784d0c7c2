"""GCE preemption notices: the metadata key ``instance/preempted`` turns ``TRUE`` about 30 s
before a spot/preemptible TPU VM is reclaimed. The watcher long-polls it
(``?wait_for_change=true``) in a daemon thread and calls ``notify`` once; the runtime then takes
its emergency checkpoint exactly as for SIGTERM.

Active only on GCE (``/sys/class/dmi/id/product_name`` says Google) or when ``GCE_METADATA_HOST``
points at a metadata server (the variable google-auth honours; tests set it).
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from aios.devices.pci import is_tpu_chip
from aios.types import Notice, PreemptionWatcher

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


#: seconds between the preemption notice and the VM's stop on Compute Engine
PREEMPTION_NOTICE_S = 30.0


class GcePreemptionWatcher(PreemptionWatcher):
    name = "gce-metadata"

    def __init__(
        self,
        host: str | None = None,
        timeout: float = 60.0,
        retry: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.clock = clock
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

    def start(self, notify: Callable[[Notice | str], None]) -> None:
        def loop() -> None:
            wait = False
            while not self._stop.is_set():
                try:
                    if self._get(wait).upper() == "TRUE":
                        # Compute Engine stops a preempted VM 30 s after the notice
                        # (https://cloud.google.com/compute/docs/instances/preemptible#preemption-process)
                        notify(
                            Notice(
                                source="gce-preemption",
                                reason="GCE preemption notice (metadata instance/preempted=TRUE)",
                                deadline=self.clock() + PREEMPTION_NOTICE_S,
                            )
                        )
                        return
                    wait = True
                except (urllib.error.URLError, OSError, ValueError):
                    wait = False
                    self._stop.wait(self.retry)

        self._thread = threading.Thread(target=loop, name="aios-gce-preempted", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()


#: the metadata key where Cloud TPU announces upcoming host maintenance
#: (https://cloud.google.com/tpu/docs/view-maintenance-notifications)
MAINTENANCE_KEY = "instance/upcoming-maintenance"


def _rfc3339(text: str) -> float | None:
    from datetime import datetime

    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except (ValueError, AttributeError):
        return None


def maintenance_notice(body: str) -> Notice | None:
    """The notice an ``upcoming-maintenance`` answer stands for: its window's start is the
    deadline (a host event interrupts the whole slice). None while there is no notification
    (the server answers ``{"error": "no notifications have been received yet..."}``)."""
    try:
        data = json.loads(body or "{}")
    except ValueError:
        return None
    if not isinstance(data, dict) or "error" in data:
        return None
    start = _rfc3339(str(data.get("windowStartTime") or ""))
    if start is None and str(data.get("maintenanceStatus", "")).upper() != "ONGOING":
        return None
    kind = str(data.get("maintenanceType") or "maintenance").lower()
    when = time.strftime("%H:%M:%S UTC", time.gmtime(start)) if start else "now"
    return Notice(
        source="tpu-maintenance",
        reason=f"Cloud TPU {kind} host maintenance from {when} (metadata {MAINTENANCE_KEY})",
        deadline=start,
    )


class TpuMaintenanceWatcher(PreemptionWatcher):
    """Polls the metadata server's upcoming-maintenance key on a TPU VM host and calls
    ``notify(Notice)`` once a window is announced (scheduled events come days ahead; the
    runtime checkpoints in time for the window's start)."""

    name = "tpu-maintenance"

    def __init__(self, host: str | None = None, interval: float = 30.0) -> None:
        self.host = host or metadata_host()
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll_once(self) -> Notice | None:
        url = f"http://{self.host}/computeMetadata/v1/{MAINTENANCE_KEY}"
        req = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return maintenance_notice(r.read().decode())
        except urllib.error.HTTPError as exc:
            return maintenance_notice(exc.read().decode(errors="replace"))
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def start(self, notify: Callable[[Notice | str], None]) -> None:
        def loop() -> None:
            while not self._stop.is_set():
                notice = self.poll_once()
                if notice is not None:
                    notify(notice)
                    return
                self._stop.wait(self.interval)

        self._thread = threading.Thread(target=loop, name="aios-tpu-maintenance", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()


def on_tpu_vm() -> bool:
    """A Cloud TPU VM host: GCE with TPU chips on the PCI bus (aios.devices.pci's table)."""

    root = Path(os.environ.get("AIOS_TEST_SYSFS_PCI") or "/sys/bus/pci/devices")
    try:
        for dev in root.iterdir():
            try:
                if is_tpu_chip((dev / "vendor").read_text(), (dev / "device").read_text()):
                    return True
            except OSError:
                continue
    except OSError:
        return False
    return False
