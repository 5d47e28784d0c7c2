"""EC2 spot interruption notices from the instance metadata service (IMDSv2).

Every host polls ``/latest/meta-data/spot/instance-action`` with a session token
(``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds``; then ``GET`` with
``X-aws-ec2-metadata-token``). ``404`` means no notice; ``200`` carries
``{"action": "terminate"|"stop"|"hibernate", "time": "2026-11-22T12:00:00Z"}``: the instance goes
away two minutes after the notice. The watcher hands it to the runtime's preemption path
(:class:`aios.resilience.notices.PreemptionMonitor`), which checkpoints at the next step boundary.

The endpoint is botocore's: ``AWS_EC2_METADATA_SERVICE_ENDPOINT`` (default
``http://169.254.169.254``). Only the standard library is used (no boto3 in the training
processes).
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

from aios.types import Notice, PreemptionWatcher

DEFAULT_ENDPOINT = "http://169.254.169.254"
TOKEN_PATH = "/latest/api/token"
NOTICE_PATH = "/latest/meta-data/spot/instance-action"
TOKEN_TTL = 21600


def endpoint() -> str:
    return os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT", DEFAULT_ENDPOINT).rstrip("/")


@dataclass(frozen=True)
class SpotNotice:
    action: str
    time: str

    def seconds_left(self, now: datetime | None = None) -> float | None:
        try:
            when = datetime.strptime(self.time, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
        except ValueError:
            return None
        now = now or datetime.now(timezone.utc)
        return (when - now).total_seconds()

    def reason(self) -> str:
        left = self.seconds_left()
        tail = f", {left:.0f}s left" if left is not None else ""
        return f"EC2 spot interruption notice: {self.action} at {self.time}{tail}"

    def deadline(self) -> float | None:
        """The instance-action's ``time`` as epoch seconds (when EC2 acts), None if unreadable."""
        try:
            when = datetime.strptime(self.time, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
        except ValueError:
            return None
        return when.timestamp()

    def to_notice(self) -> Notice:
        """The notice with its deadline: the action's own time
        (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html)."""
        return Notice(source="aws-spot", reason=self.reason(), deadline=self.deadline())


class ImdsClient:
    """A minimal IMDSv2 client: a session token, refreshed before it expires or on 401."""

    def __init__(self, base: str | None = None, timeout: float = 1.0, ttl: int = TOKEN_TTL) -> None:
        self.base = (base or endpoint()).rstrip("/")
        self.timeout = timeout
        self.ttl = ttl
        self._token: str | None = None
        self._expires = 0.0

    def token(self) -> str:
        if self._token is None or time.monotonic() > self._expires - 60:
            req = urllib.request.Request(
                self.base + TOKEN_PATH,
                method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self.ttl)},
            )
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                self._token = resp.read().decode().strip()
            self._expires = time.monotonic() + self.ttl
        return self._token

    def get(self, path: str) -> str | None:
        """The text at ``path``, or ``None`` on 404."""
        for attempt in (0, 1):
            req = urllib.request.Request(
                self.base + path, headers={"X-aws-ec2-metadata-token": self.token()}
            )
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return resp.read().decode()
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                if exc.code == 401 and attempt == 0:  # token expired or revoked: get a new one
                    self._token = None
                    continue
                raise
        return None  # pragma: no cover

    def spot_notice(self) -> SpotNotice | None:
        text = self.get(NOTICE_PATH)
        if not text:
            return None
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            return SpotNotice("terminate", text.strip())
        return SpotNotice(str(data.get("action", "terminate")), str(data.get("time", "")))


class SpotInterruptionWatcher(PreemptionWatcher):
    """Polls the spot notice every ``interval`` seconds in a daemon thread and calls
    ``notify(reason)`` once. Metadata errors (IMDS briefly unreachable) are retried silently;
    the thread ends after the notice or on :meth:`stop`."""

    name = "aws-spot"

    def __init__(
        self,
        interval: float = 5.0,
        base: str | None = None,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.interval = interval
        self.client = ImdsClient(base)
        self.on_error = on_error
        self.notice: SpotNotice | None = None
        self.polls = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll_once(self) -> SpotNotice | None:
        self.polls += 1
        return self.client.spot_notice()

    def start(self, notify: Callable[[Notice | str], None]) -> None:
        def run() -> None:
            errors = 0
            while not self._stop.is_set():
                try:
                    notice = self.poll_once()
                    errors = 0
                except Exception as exc:  # noqa: BLE001 - keep polling
                    errors += 1
                    if self.on_error and errors in (1, 10):
                        self.on_error(f"IMDS spot notice poll failed: {exc}")
                    notice = None
                if notice is not None:
                    self.notice = notice
                    notify(notice.to_notice())
                    return
                self._stop.wait(self.interval)

        self._thread = threading.Thread(target=run, name="aios-aws-spot-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)


def on_ec2() -> bool:
    """Whether this machine is an EC2 instance, from DMI (no network call)."""
    for path in (
        "/sys/devices/virtual/dmi/id/board_vendor",
        "/sys/devices/virtual/dmi/id/sys_vendor",
    ):
        try:
            with open(path) as f:
                if "Amazon" in f.read():
                    return True
        except OSError:
            continue
    return False
