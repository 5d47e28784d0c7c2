"""Catalog and validation: the TPU types offered, their zones and runtimes, the checks a request
passes before anything is created, and the create plan (node or queued resource)."""

from __future__ import annotations

import datetime as _dt
import re
import time
from dataclasses import replace
from typing import Any

from aios.errors import AiosError
from aios_cloud.provider.data import CatalogEntry, ClusterRequest
from aios_cloud.provider.errors import CloudError

from aios_cloud_gcp import catalog as _catalog
from aios_cloud_gcp.base import (
    CLOUD_PLATFORM_SCOPE,
    PUBLIC_KEY_PLACEHOLDER,
    CreatePlan,
    GcpBase,
    _parse_when,
    _rfc3339,
)


class GcpOfferings(GcpBase):
    """The TPU provider's catalog and validation."""

    # -------------------------------------------------------------- catalog
    def catalog(self) -> list[CatalogEntry]:
        return _catalog.catalog(self.settings)

    def entry(self, accelerator: str) -> CatalogEntry:
        try:
            return _catalog.entry_for(accelerator, self.settings)
        except AiosError as exc:
            raise CloudError(
                f"unknown accelerator '{accelerator}' for cloud gcp ({exc.message})",
                "pick one from `aios catalog --cloud gcp` (e.g. v4-16, v5litepod-8, v6e-4)",
            ) from None

    def validate(self, request: ClusterRequest) -> ClusterRequest:
        entry = self.entry(request.accelerator)
        if _catalog.generation(entry.accelerator) in _catalog.GKE_ONLY:
            raise CloudError(
                f"{entry.accelerator}: TPU7x is served through GKE (and Compute Engine) only, not "
                "the Cloud TPU API aios uses for --cloud gcp",
                f"run it on a GKE cluster with a tpu7x node pool: aios launch --cloud k8s -a "
                f"{entry.accelerator} ... (https://cloud.google.com/tpu/docs/tpu7x)",
            )
        zone = request.zone or self.settings.zone
        if zone and entry.zones and zone not in entry.zones:
            raise CloudError(
                f"zone '{zone}' does not offer {entry.accelerator}",
                f"use one of: {', '.join(entry.zones)}",
            )
        if request.region:
            in_region = [z for z in entry.zones if self.zone_region(z) == request.region]
            if zone and self.zone_region(zone) != request.region:
                if request.zone:
                    raise CloudError(
                        f"zone '{zone}' is not in region {request.region}",
                        f"drop --zone or --region, or use one of: {', '.join(in_region) or 'none there'}",
                    )
                zone = None  # gcp.zone is only a default
            if not in_region:
                regions = sorted({self.zone_region(z) for z in entry.zones})
                raise CloudError(
                    f"region {request.region} offers no {entry.accelerator}",
                    f"use one of: {', '.join(regions)}",
                )
            zone = zone or in_region[0]
        if request.nodes != 1:
            raise CloudError(
                f"--nodes {request.nodes}: multislice TPU clusters are not supported",
                "use one larger slice (e.g. v4-32 instead of 2 x v4-16)",
            )
        if request.extra.get("reservation") and request.spot:
            raise CloudError(
                "--spot and --reservation contradict each other (reserved capacity is not spot)",
                "pass only one",
            )
        # a relative time is made absolute once, here: every zone the failover tries (and a
        # managed recreate) then queues against the same deadline, not a fresh "+6h" each
        now = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)
        whens = {}
        for what, value in (
            ("--valid-after", request.valid_after),
            ("--valid-until", request.valid_until),
        ):
            if value:
                kind, v = _parse_when(value, what)
                value = _rfc3339(now + _dt.timedelta(seconds=v) if kind == "duration" else v)
            whens[what] = value
        request = replace(
            request, valid_after=whens["--valid-after"], valid_until=whens["--valid-until"]
        )
        labels = {
            k.lower(): re.sub(r"[^a-z0-9_-]", "-", str(v).lower())[:63]
            for k, v in request.labels.items()
        }
        return replace(
            request,
            accelerator=entry.accelerator,
            zone=zone or (entry.zones[0] if entry.zones else None),
            image=request.image or entry.runtime,
            project=self.project(request.project),
            labels=labels,
        )

    # -------------------------------------------------------------- the create plan
    def plan_create(self, request: ClusterRequest) -> CreatePlan:
        """The one REST body :meth:`create` sends and :meth:`render_create` prints as ``gcloud``
        (so the dry run shows exactly what a launch sends)."""
        project = self.project(request.project)
        zone = request.zone or "-"
        parent = f"projects/{project}/locations/{zone}"
        node: dict[str, Any] = {
            "acceleratorType": request.accelerator,
            "runtimeVersion": request.image or self.entry(request.accelerator).runtime,
            "networkConfig": {"enableExternalIps": not self.settings.use_internal_ip},
        }
        if request.labels:
            node["labels"] = dict(sorted(request.labels.items()))
        key = request.ssh_public_key or PUBLIC_KEY_PLACEHOLDER
        if self.settings.os_login:
            # the key lives in the user's OS Login profile (imported by prepare); ssh-keys
            # metadata is ignored where OS Login is enforced
            node["metadata"] = {"enable-oslogin": "TRUE"}
        else:
            node["metadata"] = {"ssh-keys": f"{request.ssh_user}:{key}"}
        if self.settings.network:
            node["networkConfig"]["network"] = self.settings.network
        if self.settings.subnetwork:
            node["networkConfig"]["subnetwork"] = self.settings.subnetwork
        if self.settings.service_account:
            node["serviceAccount"] = {
                "email": self.settings.service_account,
                "scope": [CLOUD_PLATFORM_SCOPE],
            }
        reservation = request.extra.get("reservation")
        if not request.queued:
            sched = {}
            if request.spot:
                sched["spot"] = True
            if reservation:
                sched["reserved"] = True
            if sched:
                node["schedulingConfig"] = sched
            return CreatePlan("node", project, zone, request.name, node)
        body: dict[str, Any] = {
            "tpu": {"nodeSpec": [{"parent": parent, "nodeId": request.name, "node": node}]}
        }
        if request.spot:
            body["spot"] = {}
        if reservation:
            body["reservationName"] = (
                reservation
                if reservation.startswith("projects/")
                else f"projects/{project}/locations/{zone}/reservations/{reservation}"
            )
        policy: dict[str, Any] = {}
        whens = {
            f: _parse_when(t, f"--{f.replace('A', '-a').replace('U', '-u')}")
            for f, t in (("validAfter", request.valid_after), ("validUntil", request.valid_until))
            if t
        }
        if len(whens) == 2:
            # after and until share one oneof in the API: both together are an interval
            now = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)
            ends = [
                now + _dt.timedelta(seconds=v) if k == "duration" else v
                for k, v in (whens["validAfter"], whens["validUntil"])
            ]
            policy["validInterval"] = {"startTime": _rfc3339(ends[0]), "endTime": _rfc3339(ends[1])}
        for field_, (kind, value) in whens.items() if len(whens) == 1 else ():
            policy[f"{field_}Duration" if kind == "duration" else f"{field_}Time"] = (
                f"{value}s" if kind == "duration" else _rfc3339(value)
            )
        if policy:
            body["queueingPolicy"] = policy
        return CreatePlan("queued", project, zone, request.name, body)

    def queue_deadline(self, request: ClusterRequest, now: float | None = None) -> float:
        """Seconds to wait for a queued resource: until ``--valid-until`` (plus a grace for the
        API to mark it FAILED), else ``gcp.queue_timeout``."""
        now = time.time() if now is None else now
        if not request.valid_until:
            return self.settings.queue_timeout
        kind, value = _parse_when(request.valid_until, "--valid-until")
        until = value if kind == "duration" else value.timestamp() - now
        return max(0.0, until) + self.settings.queue_grace
