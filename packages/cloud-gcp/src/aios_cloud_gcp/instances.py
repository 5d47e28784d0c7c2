"""TPU lifecycle: create (a node or a queued resource), describe/list, stop/start, delete and
repair."""

from __future__ import annotations

import json
import time
from typing import Any

from aios.errors import AiosError
from aios_cloud.provider.data import ClusterHost, ClusterInfo, ClusterRequest
from aios_cloud.provider.errors import CapacityError, CloudError
from aios_cloud.provider.states import (
    FAILED,
    HEALTHY,
    MAINTENANCE,
    QUEUED,
    READY,
    UNHEALTHY,
    UNKNOWN,
)

from aios_cloud_gcp.base import (
    _QR_WAITING,
    _STATE,
    PUBLIC_KEY_PLACEHOLDER,
    TransientCloudError,
    _SuppressAll,
)
from aios_cloud_gcp.dryrun import GcpDryRun


class GcpInstances(GcpDryRun):
    """The TPU provider's lifecycle."""

    # -------------------------------------------------------------- lifecycle
    def create(self, request: ClusterRequest) -> ClusterInfo:
        from google.cloud import tpu_v2

        client = self.client()
        plan = self.plan_create(request)
        if PUBLIC_KEY_PLACEHOLDER in json.dumps(plan.body):
            del plan.node[
                "metadata"
            ]  # no key to install (API-level use); the dry run shows the placeholder
        parent = plan.parent
        what = f"create {request.accelerator} '{request.name}' in {request.zone}"
        try:
            if plan.kind == "queued":
                qr = tpu_v2.QueuedResource.from_json(json.dumps(plan.body))
                op = client.create_queued_resource(
                    parent=parent, queued_resource_id=request.name, queued_resource=qr
                )
                self._wait(op, what)
                self._wait_queued(f"{parent}/queuedResources/{request.name}", what, request)
            else:
                op = client.create_node(
                    parent=parent,
                    node_id=request.name,
                    node=tpu_v2.Node.from_json(json.dumps(plan.body)),
                )
                self._wait(op, what)
            got = client.get_node(name=f"{parent}/nodes/{request.name}")
        except Exception as exc:  # noqa: BLE001
            raise self._map(exc, what) from None
        info = self._info(got, request.zone)
        if info.state != READY:
            raise CloudError(
                f"{what}: node is {info.state} after creation",
                "see `aios status --refresh`; delete it with `aios down`",
            )
        return info

    def _wait_queued(self, qr_name: str, what: str, request: ClusterRequest) -> None:
        """Wait until the queued resource is ACTIVE. A transient API error while waiting never
        gives up the queue position: it is retried until the deadline."""
        client = self.client()
        budget = self.queue_deadline(request)
        deadline = time.monotonic() + budget
        transient = 0
        while True:
            try:
                qr = client.get_queued_resource(name=qr_name)
                transient = 0
            except Exception as exc:  # noqa: BLE001 - mapped
                mapped = self._map(exc, what)
                if not isinstance(mapped, TransientCloudError) or time.monotonic() > deadline:
                    raise mapped from None
                transient += 1
                time.sleep(min(60.0, self.settings.poll_interval * 2 ** min(transient, 6)))
                continue
            state = qr.state.state.name if qr.state else "STATE_UNSPECIFIED"
            if state == "ACTIVE":
                return
            if state in ("FAILED", "SUSPENDED", "SUSPENDING"):
                detail = ""
                with _SuppressAll():
                    detail = qr.state.failed_data.error.message
                raise CapacityError(
                    f"{what}: queued resource {state.lower()}{': ' + detail if detail else ''}",
                    "retry later or widen --valid-until",
                )
            if time.monotonic() > deadline:
                raise CloudError(
                    f"{what}: queued resource still {state} after {budget:.0f}s",
                    "widen --valid-until (or gcp.queue_timeout)",
                )
            time.sleep(self.settings.poll_interval)

    def _info(self, node: Any, zone: str | None) -> ClusterInfo:
        state_name = node.state.name if hasattr(node.state, "name") else str(node.state)
        health_name = node.health.name if hasattr(node.health, "name") else str(node.health)
        if health_name == "HEALTHY":
            health = HEALTHY
        elif health_name == "UNHEALTHY_MAINTENANCE":
            health = MAINTENANCE  # the slice was interrupted (the watcher's incident)
        elif health_name.startswith("UNHEALTHY") or health_name == "TIMEOUT":
            health = UNHEALTHY
        else:
            health = UNKNOWN
        hosts = []
        for i, ep in enumerate(node.network_endpoints):
            external = ep.access_config.external_ip if ep.access_config else ""
            ip = ep.ip_address if self.settings.use_internal_ip or not external else external
            hosts.append(
                ClusterHost(
                    worker_id=i,
                    ip=ip,
                    internal_ip=ep.ip_address or None,
                    ssh_user=self.settings.ssh_user,
                )
            )
        name = node.name.rsplit("/", 1)[-1]
        zone = zone if zone and zone != "-" else node.name.split("/locations/")[1].split("/")[0]
        return ClusterInfo(
            name=name,
            cloud="gcp",
            zone=zone,
            accelerator=node.accelerator_type,
            state=_STATE.get(state_name, UNKNOWN),
            health=health,
            health_detail=health_name
            if health in (UNHEALTHY, MAINTENANCE)
            else (node.health_description or ""),
            spot=bool(
                node.scheduling_config
                and (node.scheduling_config.spot or node.scheduling_config.preemptible)
            ),
            hosts=hosts,
            runtime=node.runtime_version,
            labels=dict(node.labels),
            created=str(node.create_time) if node.create_time else None,
            raw={
                "state": state_name,
                "health": health_name,
                "queued_resource": node.queued_resource or None,
            },
        )

    def describe(self, name: str, zone: str | None) -> ClusterInfo | None:
        from google.api_core import exceptions as gex

        client = self.client()
        try:
            return self._info(client.get_node(name=self._node_name(name, zone)), zone)
        except gex.NotFound:
            pass
        except Exception as exc:  # noqa: BLE001
            raise self._map(exc, f"describe {name}") from None
        try:  # a queued resource still waiting has no node yet
            qr = client.get_queued_resource(name=f"{self._parent(zone)}/queuedResources/{name}")
        except gex.NotFound:
            return None
        except Exception as exc:  # noqa: BLE001
            raise self._map(exc, f"describe {name}") from None
        state = qr.state.state.name if qr.state else "STATE_UNSPECIFIED"
        return ClusterInfo(
            name=name,
            cloud="gcp",
            zone=zone,
            accelerator="",
            state=QUEUED if state in _QR_WAITING else FAILED,
            raw={"queued_resource_state": state},
        )

    def list(self, zone: str | None = None) -> list[ClusterInfo]:
        client = self.client()
        try:
            nodes = list(client.list_nodes(parent=self._parent(zone)))
        except Exception as exc:  # noqa: BLE001
            raise self._map(exc, "list TPU nodes") from None
        out = [self._info(n, None) for n in nodes if "aios-cluster" in n.labels]
        have = {c.name for c in out}
        try:
            qrs = list(client.list_queued_resources(parent=self._parent(zone)))
        except Exception as exc:  # noqa: BLE001
            raise self._map(exc, "list queued resources") from None
        for qr in qrs:  # still waiting: no node yet, the labels are in its node spec
            specs = list(qr.tpu.node_spec) if qr.tpu else []
            if not specs or "aios-cluster" not in specs[0].node.labels:
                continue
            name = qr.name.rsplit("/", 1)[-1]
            if name in have:
                continue
            state = qr.state.state.name if qr.state else "STATE_UNSPECIFIED"
            qzone = qr.name.split("/locations/")[1].split("/")[0]
            out.append(
                ClusterInfo(
                    name=name,
                    cloud="gcp",
                    zone=qzone,
                    accelerator=specs[0].node.accelerator_type,
                    state=QUEUED if state in _QR_WAITING else FAILED,
                    spot=bool(qr.spot),
                    labels=dict(specs[0].node.labels),
                    raw={"queued_resource_state": state},
                )
            )
        return out

    def start(self, name: str, zone: str | None) -> ClusterInfo:
        client = self.client()
        what = f"start {name}"
        try:
            self._wait(client.start_node(request={"name": self._node_name(name, zone)}), what)
            info = self._info(client.get_node(name=self._node_name(name, zone)), zone)
        except Exception as exc:  # noqa: BLE001
            raise self._map(exc, what) from None
        return info

    def stop_refusal(self, spot: bool, accelerator: str | None = None) -> str | None:
        if spot:
            return super().stop_refusal(spot, accelerator)
        if accelerator and self.entry(accelerator).hosts > 1:
            # "This operation is only available with single TPU nodes"
            # (https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes/stop)
            return f"{accelerator} is a multi-host slice, which Cloud TPU cannot stop, only delete"
        return None

    def stop(self, name: str, zone: str | None) -> None:
        client = self.client()
        what = f"stop {name}"
        info = self.describe(name, zone)
        why = self.stop_refusal(info.spot, info.accelerator) if info is not None else None
        if why:
            raise CloudError(
                f"cannot stop {name}: {why}",
                f"delete it with `aios down {name}` (a managed run recreates it), or use "
                "--autostop N --autodown to delete it when idle",
            )
        try:
            self._wait(client.stop_node(request={"name": self._node_name(name, zone)}), what)
        except Exception as exc:  # noqa: BLE001
            raise self._map(exc, what) from None

    def delete(self, name: str, zone: str | None) -> None:
        from google.api_core import exceptions as gex
        from google.cloud import tpu_v2

        client = self.client()
        what = f"delete {name}"
        try:
            try:
                op = client.delete_queued_resource(
                    request=tpu_v2.DeleteQueuedResourceRequest(
                        name=f"{self._parent(zone)}/queuedResources/{name}", force=True
                    )
                )
                self._wait(op, what)
            except gex.NotFound:
                pass
            try:
                self._wait(client.delete_node(name=self._node_name(name, zone)), what)
            except gex.NotFound:
                pass
            except CloudError as exc:
                if "not found" not in str(exc).lower():
                    raise
        except gex.NotFound:
            return
        except AiosError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise self._map(exc, what) from None

    def repair(self, info: ClusterInfo) -> str:
        why = self.stop_refusal(info.spot, info.accelerator)
        if why:
            raise CloudError(f"{info.name} cannot be stopped and restarted: {why}", "recreate it")
        return super().repair(info)
