"""Zone failover: create a cluster in the first zone that has capacity.

Stockouts and quota errors (as classified by :meth:`CloudProvider.classify_error`) move on to the
next zone offering the type; transient errors retry the same zone; each attempt waits an
exponentially growing, jittered delay. Whatever a failed attempt left in a zone is deleted before
moving on, so a launch that fails everywhere leaves nothing behind.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aios_cloud.provider.base import CloudProvider
from aios_cloud.provider.data import ClusterInfo, ClusterRequest
from aios_cloud.provider.errors import (
    CapacityError,
    CloudError,
    CredentialsError,
    NotOfferedError,
    QuotaError,
)


@dataclass
class Attempt:
    zone: str
    kind: str
    message: str


@dataclass
class FailoverResult:
    info: ClusterInfo
    zone: str
    attempts: list[Attempt] = field(default_factory=list)


def zone_order(provider: CloudProvider, request: ClusterRequest, pinned: bool) -> list[str]:
    """The zones to try: the requested zone first; the others offering the type after it unless
    the user pinned the zone with ``--zone`` and ``--no-failover``."""
    offered = provider.zones(request.accelerator)
    if request.region:
        offered = [z for z in offered if provider.zone_region(z) == request.region]
    if request.zone:
        rest = [z for z in offered if z != request.zone]
        return [request.zone] if pinned else [request.zone, *rest]
    return offered or ([request.zone] if request.zone else [])


def create_with_failover(
    provider: CloudProvider,
    request: ClusterRequest,
    zones: list[str],
    log: Callable[[str], None] = lambda m: None,
    backoff: float = 2.0,
    max_backoff: float = 60.0,
    transient_retries: int = 3,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
) -> FailoverResult:
    """Try ``zones`` in order. Returns the ready cluster; raises the last capacity/quota error
    (one line listing every zone tried) when all fail, or the first fatal error at once."""
    rng = rng or random.Random()
    attempts: list[Attempt] = []
    delay = backoff
    if not zones:
        raise CloudError(
            f"no zone offers {request.accelerator}", f"see `aios catalog --cloud {provider.name}`"
        )
    for i, zone in enumerate(zones):
        tries = 0
        while True:
            req = request.with_zone(zone)
            try:
                log(
                    f"creating {request.name} ({request.accelerator}{', spot' if request.spot else ''}) in {zone}"
                )
                info = provider.create(req)
                return FailoverResult(info, zone, attempts)
            except (KeyboardInterrupt, SystemExit) as exc:
                # Ctrl-C / SIGTERM while a node or queued resource is being created: delete
                # what was started before giving up; if even that is interrupted or fails,
                # mark the exception so the caller keeps the record (`aios down NAME`).
                log(
                    f"interrupted while creating {request.name} in {zone}; deleting what was started"
                )
                if not _cleanup_shielded(provider, request.name, zone, log):
                    exc.aios_leftover_zone = zone  # type: ignore[union-attr]
                raise
            except Exception as exc:
                kind = provider.classify_error(exc)
                attempts.append(Attempt(zone, kind, str(exc)))
                if not isinstance(exc, CredentialsError):  # without credentials nothing was created
                    _cleanup(provider, request.name, zone, log)
                if kind == "fatal":
                    raise
                if kind == "transient" and tries < transient_retries:
                    tries += 1
                    wait = min(max_backoff, delay) * (0.5 + rng.random())
                    log(f"{zone}: transient error ({_short(exc)}); retrying in {wait:.1f}s")
                    sleep(wait)
                    delay *= 2
                    continue
                if kind == "unavailable":
                    if i + 1 < len(zones):
                        log(
                            f"{zone}: does not offer {request.accelerator} ({_short(exc)}); trying {zones[i + 1]}"
                        )
                    break
                if i + 1 < len(zones):
                    wait = min(max_backoff, delay) * (0.5 + rng.random())
                    log(f"{zone}: {kind} ({_short(exc)}); trying {zones[i + 1]} in {wait:.1f}s")
                    sleep(wait)
                    delay *= 2
                break
    tried = ", ".join(f"{a.zone} ({a.kind})" for a in attempts)
    last = attempts[-1]
    kinds = {a.kind for a in attempts}
    if kinds == {"unavailable"}:
        raise NotOfferedError(
            f"no zone tried offers {request.accelerator}: tried {tried}; last: {_short(last.message)}",
            f"pick a zone from `aios catalog --cloud {provider.name}`, or another type",
        )
    cls = QuotaError if kinds <= {"quota", "unavailable"} and "quota" in kinds else CapacityError
    fix = (
        "request more quota in the cloud console, or pick another type"
        if cls is QuotaError
        else "retry later, use --queued to wait for capacity, or pick another type/zone"
    )
    raise cls(
        f"could not create {request.accelerator} in any zone: tried {tried}; last: {_short(last.message)}",
        fix,
    )


def _cleanup_shielded(
    provider: CloudProvider, name: str, zone: str, log: Callable[[str], None]
) -> bool:
    """Delete ``name`` in ``zone`` with Ctrl-C and SIGTERM held off (main thread only) so a second
    Ctrl-C cannot leave a half-deleted, billing resource behind. Returns whether it succeeded."""
    import signal
    import threading

    held: list[int] = []
    old: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():

        def hold(signum: int, frame: object) -> None:
            held.append(signum)
            log("still deleting what was started; aios exits when that is done")

        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, hold)
    try:
        provider.delete(name, zone)
        return True
    except BaseException as exc:  # noqa: BLE001 - reported; the record is kept
        log(f"cleanup of {name} in {zone} failed: {_short(exc)}; `aios down {name}` deletes it")
        return False
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _cleanup(provider: CloudProvider, name: str, zone: str, log: Callable[[str], None]) -> None:
    try:
        provider.delete(name, zone)
    except Exception as exc:  # noqa: BLE001 - report, the caller decides
        log(f"cleanup of {name} in {zone} failed: {_short(exc)}")


def _short(exc: object) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:200]
