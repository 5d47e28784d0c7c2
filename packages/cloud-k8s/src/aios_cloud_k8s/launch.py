"""``aios launch --cloud k8s`` and ``aios logs`` for Kubernetes jobs (see :mod:`aios_cloud_k8s.provider`)."""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import yaml
from aios.config.redact import is_secret, redact_url
from aios.errors import AiosError
from aios_cloud.codesync import make_tarball
from aios_cloud.request import LaunchRequest
from aios_cloud.store import (
    JOB_FAILED,
    JOB_PENDING,
    JOB_RUNNING,
    JOB_SUCCEEDED,
    ClusterRecord,
    Store,
    cluster_dir,
)

from aios_cloud_k8s import manifests as M

if TYPE_CHECKING:
    from aios_cloud_k8s.settings import K8sSettings


class K8sAccess(Protocol):
    """What the launch needs of the Kubernetes provider (:class:`aios_cloud_k8s.provider.K8sProvider`
    passes itself; declared here so this module does not import the provider)."""

    name: ClassVar[str]
    settings: K8sSettings
    grace_seconds: float
    #: the scheduler's reason for a pod that waits, set by :meth:`job_state` ("" when none)
    pending_reason: str
    #: why a suspended job waits and the fix, set by :meth:`job_state` ("" when none)
    suspended_reason: str
    #: whether the suspended job carries a Kueue queue label (then it may still be admitted)
    suspended_queued: bool

    def client(self) -> Any: ...
    def check_node_pools(self, place: M.Placement) -> M.Placement: ...
    def apply(self, objs: list[dict[str, Any]]) -> list[dict[str, Any]]: ...
    def cancel(self, name: str, api: str | None = None) -> None: ...
    def job_state(self, name: str, api: str) -> tuple[str, dict[str, Any]]: ...
    def pods(self, name: str) -> list[Any]: ...
    def pod_log(self, pod: str) -> str: ...


NAME_RE = __import__("re").compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")


def _check(p: LaunchRequest) -> None:
    # the options Kubernetes does not support were refused against K8sProvider.features
    if p.name and not NAME_RE.match(p.name):
        raise AiosError(
            f"job name '{p.name}' is invalid for Kubernetes",
            "use 1-40 lowercase letters, digits and dashes, starting with a letter",
        )


def build(
    provider: K8sAccess, p: LaunchRequest, name: str, env: dict[str, str], forward: list[str]
) -> M.JobRequest:
    s = provider.settings
    if not s.image:
        raise AiosError(
            "no container image for the pods",
            "set k8s.image (AIOS_K8S__IMAGE=REGISTRY/IMAGE:TAG) to an image with python, torch and aios",
        )
    accelerator = p.accelerator or "cpu"
    place = M.placement(accelerator, p.nodes)
    if p.spot and place.kind != "tpu":
        raise AiosError(
            "--spot on Kubernetes selects GKE Spot TPU node pools (cloud.google.com/gke-spot)",
            "pick a TPU type, or select spot nodes of your own through the node pool",
        )
    api = (
        s.api
        if s.api != "auto"
        else ("jobset" if place.kind == "tpu" or place.pods_per_job > 1 else "job")
    )
    if api == "job" and place.jobs > 1:
        raise AiosError(f"{p.nodes} TPU slices need a JobSet", "set k8s.api=jobset (or auto)")
    args = list(p.script_args)
    if args and args[0] == "--":
        args = args[1:]
    backend = p.backend or place.backend
    python = p.python or s.python
    command = [
        python,
        "-m",
        "aios.cli.run",
        "--backend",
        backend,
        *(["-m", p.script] if p.module else [p.script]),
        *args,
    ]
    job_env = dict(env)
    if p.checkpoint_dir:
        job_env["AIOS_CHECKPOINT__DIR"] = p.checkpoint_dir
    req = M.JobRequest(
        name=name,
        namespace=s.namespace,
        image=s.image,
        command=command,
        place=place,
        api=api,
        env=job_env,
        secret_name=f"{name}-env" if forward else None,
        code_configmap=f"{name}-code",
        master_port=s.master_port,
        service_account=s.service_account,
        cpu=s.cpu,
        memory=s.memory,
        backoff_limit=p.max_restarts,
        max_restarts=p.max_restarts,
        grace_seconds=provider.grace_seconds,
        spot=p.spot,
        queue=s.queue,
        shm_size=s.shm_size,
    )
    M.shm_size(req)  # a bad k8s.shm_size / k8s.memory: one line, before anything is created
    return req


def _code(provider: K8sAccess, p: LaunchRequest, name: str) -> str:
    tar = make_tarball(
        p.workdir, cluster_dir(name) / "code.tar.gz", p.exclude, p.max_sync_mb * 2**20
    )
    data = Path(tar.path).read_bytes()
    if len(data) > provider.settings.max_code_kib * 1024:
        raise AiosError(
            f"the code is {len(data) // 1024} KiB compressed; a ConfigMap holds {provider.settings.max_code_kib} KiB",
            "exclude data with .gitignore/--exclude, or bake the code into k8s.image",
        )
    return base64.b64encode(data).decode()


def _default_name() -> str:
    import getpass
    import random
    import re

    user = re.sub("[^a-z0-9]", "", getpass.getuser().lower())[:12] or "user"
    return f"aios-{user}-{random.randint(0, 0xFFFF):04x}"


def redact_manifest(obj: Any) -> Any:
    """A manifest as ``kubectl apply -f -`` takes it, secrets hidden. Generic config redaction
    (:func:`aios.config.schema.redact`) hides the value of any key named like a secret, and in a
    manifest ``key`` is a field name (a toleration's ``key: google.com/tpu``, a label selector's
    ``key``), never a secret: it printed ``key: '***'``, an unapplyable manifest. Here only
    what can hold a secret is hidden: a Secret's ``data``/``stringData`` values, an env entry
    ``{name, value}`` whose name is secret-looking, and passwords inside URLs anywhere."""
    if isinstance(obj, list):
        return [redact_manifest(v) for v in obj]
    if isinstance(obj, str):
        return redact_url(obj)
    if not isinstance(obj, dict):
        return obj
    out = {k: redact_manifest(v) for k, v in obj.items()}
    if obj.get("kind") == "Secret":
        for field in ("data", "stringData"):
            if isinstance(obj.get(field), dict):
                out[field] = {
                    k: v if str(v).startswith("<") else "***" for k, v in obj[field].items()
                }
    if (
        set(obj) >= {"name", "value"}
        and is_secret(str(obj["name"]))
        and obj["value"] not in (None, "")
    ):
        out["value"] = "***"
    return out


def launch(provider: K8sAccess, p: LaunchRequest, store: Any, log: Callable[[str], None]) -> int:
    import click

    _check(p)
    env, forward = p.env, p.forward_env
    name = p.name or _default_name()
    req = build(provider, p, name, env, forward)
    if p.dry_run:
        shown = M.manifests(
            req, {k: "<forwarded from your environment>" for k in forward}, "<code.tar.gz, base64>"
        )
        for o in shown:
            if o["kind"] == "Secret":
                o["stringData"] = {k: "<forwarded from your environment>" for k in o["stringData"]}
        click.echo("# dry run: nothing is created (kubectl apply -f - equivalent)")
        click.echo(
            yaml.safe_dump_all([redact_manifest(o) for o in shown], sort_keys=False).rstrip()
        )
        return 0
    missing = [k for k in forward if k not in os.environ]
    if missing:
        raise AiosError(
            f"--env {missing[0]} is not set in your environment",
            f"export {missing[0]} before aios launch",
        )
    provider.client()  # no kubeconfig: one line, before anything is created
    fitted = provider.check_node_pools(req.place)
    if fitted != req.place:
        log(
            f"{req.place.accelerator}: the {req.place.topology} node pool has "
            f"{fitted.resources[M.TPU_RESOURCE]}-chip nodes: {fitted.pods_per_job} pods per slice "
            f"(instead of {req.place.pods_per_job} of {req.place.resources[M.TPU_RESOURCE]} chips)"
        )
        req.place = fitted
    existing = store.get_cluster(name)
    if existing is not None:
        raise AiosError(
            f"{name} already exists ({existing.cloud})",
            f"`aios down {name}` first, or use another --name",
        )
    code = _code(provider, p, name)
    objs = M.manifests(req, {k: os.environ[k] for k in forward}, code)
    if not store.claim_cluster(
        ClusterRecord(
            name,
            provider.name,
            provider.settings.namespace,
            req.place.accelerator,
            False,
            "SUBMITTING",
            request={"api": req.api, "namespace": req.namespace},
        )
    ):
        raise AiosError(f"{name} was just created by another launch", "use another --name")
    job_id = store.add_job(
        name,
        " ".join([p.script, *p.script_args]),
        backend=p.backend,
        managed=p.max_restarts > 0,
        max_restarts=p.max_restarts,
        checkpoint_dir=p.checkpoint_dir,
        spec={"cloud": "k8s", "api": req.api},
    )
    try:
        provider.apply(objs)
    except BaseException as exc:
        store.update_job(job_id, state=JOB_FAILED)
        store.delete_cluster(name)
        raise exc
    store.update_cluster(name, state="PENDING")
    store.update_job(job_id, state=JOB_PENDING)
    kinds = ", ".join(f"{o['kind']} {o['metadata']['name']}" for o in objs)
    store.event(name, "submitted", f"{kinds} in namespace {req.namespace}", job_id)
    log(
        f"created {kinds} in namespace {req.namespace} ({req.place.pods_per_job * req.place.jobs} pod(s))"
    )
    if p.detach:
        log(f"`aios logs {name} -f`, `aios status {name} --refresh`, `aios cancel {name}`")
        return 0
    try:
        code_ = follow(provider, store, name, job_id, req.api, p.poll, click.echo)
    except KeyboardInterrupt:
        log(f"detached: {name} keeps running. `aios logs {name} -f`, `aios down {name}`")
        return 130
    if p.down_after:
        provider.cancel(name, req.api)
        store.delete_cluster(name)
    return code_


def follow(
    provider: K8sAccess,
    store: Any,
    name: str,
    job_id: int,
    api: str,
    poll: float,
    echo: Callable[[str], None],
) -> int:
    """Wait for the job to end, then print every pod's log (prefixed with the pod's name)."""

    last, said = "", ""
    while True:
        state, _ = provider.job_state(name, api)
        reason = {"PENDING": provider.pending_reason, "SUSPENDED": provider.suspended_reason}.get(
            state, ""
        )
        if reason and reason != said:
            echo(f"[aios] {state.lower()}: {reason}")
            said = reason
        if state != last:
            store.update_cluster(name, state=state)
            if state == "RUNNING":
                store.update_job(job_id, state=JOB_RUNNING)
            last = state
        if state in ("COMPLETED", "FAILED", "GONE"):
            break
        if state == "SUSPENDED" and not provider.suspended_queued:
            # no queue label: Kueue never admits it; waiting here would be forever (the line
            # above said why and what to do). The job is left for `aios down`.
            return 1
        time.sleep(poll)
    for pod in provider.pods(name):
        for line in provider.pod_log(pod.metadata.name).splitlines():
            echo(f"({pod.metadata.name}) {line}")
    code = 0 if state == "COMPLETED" else 1
    store.update_job(job_id, state=JOB_SUCCEEDED if code == 0 else JOB_FAILED, exit_codes=[code])
    return code


def logs(
    provider: K8sAccess,
    rec: Any,
    job: Any,
    follow_: bool,
    dry_run: bool,
    echo: Callable[[str], None],
) -> int:
    if dry_run:
        echo(
            f"kubectl -n {provider.settings.namespace} logs -l {M.CLUSTER_LABEL}={rec.name} --prefix"
            + (" -f" if follow_ else "")
        )
        return 0
    if follow_:
        return follow(
            provider,
            Store(),
            rec.name,
            job.id,
            rec.request.get("api", "jobset"),
            provider.settings.poll_interval,
            echo,
        )
    pods = provider.pods(rec.name)
    if not pods:
        echo("[aios] no pods yet")
    for pod in pods:
        for line in provider.pod_log(pod.metadata.name).splitlines():
            echo(f"({pod.metadata.name}) {line}")
    return 0
