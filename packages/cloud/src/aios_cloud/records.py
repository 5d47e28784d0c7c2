"""Cluster and host records: where a cluster's files live on the hosts, its hosts as the store
records them, the SSH runner for them, the request it was created from, and the refresh from the
cloud's view."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aios.errors import AiosError
from aios.plugins.registry import get_registry

from aios_cloud.provider.base import Provider
from aios_cloud.provider.data import CloudCommand, ClusterHost, ClusterInfo, ClusterRequest
from aios_cloud.provider.errors import ClusterNotFound
from aios_cloud.provider.states import READY
from aios_cloud.ssh import (
    SshRunner,
)
from aios_cloud.store import (
    ClusterRecord,
    Store,
    cluster_dir,
)

Log = Callable[[str], None]


def remote_root(cluster: str) -> str:
    return f"$HOME/aios/{cluster}"


def get_provider(cloud: str, config: Any) -> Provider:
    spec = get_registry().cloud(cloud)
    return spec.factory(config)


def installed_clouds() -> list[str]:
    return sorted(get_registry().clouds)


def cloud_name(cloud: str | None, store_cloud: str | None = None) -> str:
    """The cloud a command works with: ``--cloud``, else the record's, else the only cloud
    plugin installed (``ssh``, hosts you already have, is never a default)."""
    if cloud:
        return cloud
    if store_cloud:
        return store_cloud
    clouds = [c for c in installed_clouds() if c != "ssh"]
    if len(clouds) == 1:
        return clouds[0]
    if not clouds:
        raise AiosError(
            "no cloud plugin is installed",
            "pip install -e './packages/core[gcp]' ./packages/cloud ./packages/backend-xla "
            "./packages/cloud-gcp (from the aios checkout), or for AWS: "
            "pip install -e './packages/core[aws]' ./packages/cloud ./packages/cloud-aws",
        )
    raise AiosError(f"several clouds are installed ({', '.join(clouds)})", "pick one with --cloud")


def placeholder_hosts(n: int, user: str) -> list[ClusterHost]:
    return [
        ClusterHost(i, f"<worker-{i}-ip>", f"<worker-{i}-internal-ip>", ssh_user=user)
        for i in range(n)
    ]


def record_hosts(rec: ClusterRecord) -> list[ClusterHost]:
    out = []
    for h in rec.hosts:
        host = ClusterHost(
            **{k: v for k, v in h.items() if k in {f.name for f in dataclasses.fields(ClusterHost)}}
        )
        host.ssh_user = rec.ssh_user or host.ssh_user
        host.ssh_key = rec.ssh_key or host.ssh_key
        out.append(host)
    return sorted(out, key=lambda h: h.worker_id)


def cluster_key(name: str) -> Path:
    """The SSH key aios creates for cluster ``name`` when no ``--ssh-key`` is given: authorized
    on that cluster's hosts only, so its head host may hold a copy to reach the others."""
    return cluster_dir(name) / "id_ed25519"


def runner_for(
    rec: ClusterRecord, printer: Callable[[str, str], None] | None = None, **kw: Any
) -> SshRunner:
    return SshRunner(
        record_hosts(rec),
        cluster_dir(rec.name) / "known_hosts",
        key=rec.ssh_key,
        alias=f"aios-{rec.name}",
        printer=printer,
        **kw,
    )


#: the keys of a record's ``request`` that are :class:`ClusterRequest` fields (the others, e.g.
#: ``autostop`` and ``candidates``, are what aios keeps beside it)
REQUEST_FIELDS = frozenset(f.name for f in dataclasses.fields(ClusterRequest))


def request_from_dict(d: dict[str, Any]) -> ClusterRequest:
    return ClusterRequest(**{k: v for k, v in d.items() if k in REQUEST_FIELDS})


def request_from_record(rec: ClusterRecord) -> ClusterRequest:
    return request_from_dict(rec.request)


def save_hosts(
    store: Store, rec: ClusterRecord, info: ClusterInfo, provider: Provider
) -> ClusterRecord:
    hosts = [dataclasses.asdict(h) for h in provider.hosts(info)]
    for h in hosts:
        h.pop("ssh_key", None)
    store.update_cluster(rec.name, hosts=hosts, zone=info.zone, state=info.state)
    new = store.get_cluster(rec.name)
    assert new is not None
    return new


def require_cluster(store: Store, name: str) -> ClusterRecord:
    rec = store.get_cluster(name)
    if rec is None:
        known = ", ".join(r.name for r in store.clusters()) or "none"
        raise ClusterNotFound(
            f"no cluster named '{name}' (known: {known})",
            "see `aios status`, or create it with `aios launch --name NAME`",
        )
    return rec


def request_dict(request: ClusterRequest) -> dict[str, Any]:
    d = dataclasses.asdict(request)
    d.pop("ssh_public_key", None)  # public, but bulky; re-read from the key file when needed
    return d


def with_public_key(request: ClusterRequest, key: str) -> ClusterRequest:
    pub = Path(str(key) + ".pub")
    if not pub.is_file():
        raise AiosError(
            f"public key {pub} is missing next to the SSH key {key}",
            f"recreate it with `ssh-keygen -y -f {key} > {pub}`",
        )
    return dataclasses.replace(request, ssh_public_key=pub.read_text().strip())


def info_from(rec: ClusterRecord) -> ClusterInfo:
    return ClusterInfo(
        rec.name, rec.cloud, rec.zone, rec.accelerator, READY, hosts=record_hosts(rec)
    )


def inventory(provider: Provider) -> list[ClusterInfo]:
    """Every cluster aios created in the cloud (found by the ``aios-cluster`` label / the
    ``aios:cluster`` tag), whether or not this machine has a record of it."""
    return provider.list(None)


def runner_for_name_reset(name: str) -> None:
    """Forget the pinned host keys of a deleted cluster."""
    SshRunner([], cluster_dir(name) / "known_hosts").reset_host_keys()


def refresh(store: Store, provider: Provider, rec: ClusterRecord) -> ClusterRecord:
    info = provider.describe(rec.name, rec.zone)
    if info is None:
        store.update_cluster(rec.name, state="NOT_FOUND")
    else:
        state = (
            info.state
            if not info.unhealthy
            else f"{info.state}/{info.health_detail or 'UNHEALTHY'}"
        )
        if info.waiting:  # e.g. a Kubernetes job a queue holds: the state says why, and the fix
            state = f"{state}: {info.waiting}"
        store.update_cluster(rec.name, state=state)
        if info.hosts:
            rec = save_hosts(store, rec, info, provider)
            store.update_cluster(rec.name, state=state)
    return store.get_cluster(rec.name) or rec


def dry_run_lines(commands: list[CloudCommand]) -> list[str]:
    return [c.shell() for c in commands]
