"""The Kubernetes cluster environment: ``aios-run train.py`` in a pod of a JobSet or an indexed
Job.

* Pod index within its Job: ``JOB_COMPLETION_INDEX`` (Indexed completion mode).
* JobSet: the Job's index among the replicated Job's replicas is ``JOB_INDEX`` (JobSet injects
  it; aios's manifests also map it from the ``jobset.sigs.k8s.io/job-index`` label). Pod
  hostnames are ``<jobset>-<replicatedJob>-<jobIndex>-<podIndex>`` in the headless service
  ``<subdomain>`` (JobSet's default subdomain is the JobSet's name).
* Indexed Job with ``spec.template.spec.subdomain``: hostnames ``<job>-<index>`` in service
  ``<subdomain>``.

Names come from ``JOBSET_NAME``/``REPLICATED_JOB_NAME`` (or ``HOSTNAME`` parsed as above) and
``AIOS_K8S_SUBDOMAIN`` / ``AIOS_K8S_JOB_NAME``; sizes from ``AIOS_K8S_PODS_PER_JOB`` (the Job's
parallelism) and ``REPLICATED_JOB_REPLICAS``/``AIOS_K8S_JOBS`` (replicas). aios's generated
manifests set all of them; a hand-written manifest that lacks the pod count is an error naming
the variable to add. Node rank = ``JOB_INDEX x pods_per_job + JOB_COMPLETION_INDEX``; the master
is pod 0 of Job 0 (``MASTER_ADDR`` wins when set).

Cheap: environment only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from aios.environments.base import ClusterEnvironment, ClusterInfo
from aios.errors import ConfigError


def _int(environ: Mapping[str, str], name: str, default: int | None = None) -> int | None:
    v = environ.get(name)
    if v in (None, ""):
        return default
    try:
        return int(str(v))
    except ValueError:
        raise ConfigError(
            f"environment variable {name}={v!r} is not an integer", f"fix {name} in the pod spec"
        ) from None


def jobset_hostname(
    jobset: str, replicated_job: str, job_index: int, pod_index: int, subdomain: str | None = None
) -> str:
    """``<jobset>-<replicatedJob>-<jobIndex>-<podIndex>[.<subdomain>]``."""
    base = f"{jobset}-{replicated_job}-{job_index}-{pod_index}"
    return f"{base}.{subdomain}" if subdomain else base


def job_hostname(job: str, index: int, subdomain: str | None = None) -> str:
    """``<job>-<index>[.<subdomain>]`` (an indexed Job whose pods set ``subdomain``)."""
    return f"{job}-{index}.{subdomain}" if subdomain else f"{job}-{index}"


class KubernetesEnvironment(ClusterEnvironment):
    """A pod of an indexed Job or a JobSet."""

    name = "kubernetes"
    priority = 40  # below torchelastic (100) and slurm (50)

    def detect(self, environ: Mapping[str, str]) -> bool:
        return "JOB_COMPLETION_INDEX" in environ

    def info(self, environ: Mapping[str, str]) -> ClusterInfo:
        pod = _int(environ, "JOB_COMPLETION_INDEX", 0) or 0
        pods = _int(environ, "AIOS_K8S_PODS_PER_JOB")
        if pods is None:
            raise ConfigError(
                "running in an indexed Kubernetes Job, but the number of pods per Job is unknown",
                "set env AIOS_K8S_PODS_PER_JOB to the Job's parallelism in the pod spec (aios launch --cloud k8s does)",
            )
        if not 0 <= pod < pods:
            raise ConfigError(
                f"JOB_COMPLETION_INDEX={pod} is outside the Job's {pods} pods",
                "check AIOS_K8S_PODS_PER_JOB",
            )
        subdomain = environ.get("AIOS_K8S_SUBDOMAIN") or None
        hostname = environ.get("HOSTNAME", "")
        jobset = environ.get("JOBSET_NAME")
        if jobset:
            rjob = environ.get("REPLICATED_JOB_NAME")
            job_index = _int(environ, "JOB_INDEX", 0) or 0
            if not rjob:
                m = re.match(rf"^{re.escape(jobset)}-(.+)-{job_index}-{pod}$", hostname)
                if not m:
                    raise ConfigError(
                        "running in a JobSet, but REPLICATED_JOB_NAME is not set",
                        "set it in the pod spec (aios launch --cloud k8s does)",
                    )
                rjob = m.group(1)
            jobs = (
                _int(environ, "REPLICATED_JOB_REPLICAS") or _int(environ, "AIOS_K8S_JOBS", 1) or 1
            )
            sub = subdomain or jobset
            hosts = tuple(
                jobset_hostname(jobset, rjob, j, p, sub) for j in range(jobs) for p in range(pods)
            )
            node_rank = job_index * pods + pod
        else:
            job = environ.get("AIOS_K8S_JOB_NAME")
            if not job:
                m = re.match(rf"^(.+)-{pod}$", hostname)
                if not m:
                    raise ConfigError(
                        "running in an indexed Job, but its name is unknown",
                        "set env AIOS_K8S_JOB_NAME in the pod spec (aios launch --cloud k8s does)",
                    )
                job = m.group(1)
            if not subdomain and not environ.get("MASTER_ADDR"):
                raise ConfigError(
                    f"indexed Job {job} has no headless service, so pod 0 has no stable address",
                    "set spec.template.spec.subdomain to a headless Service and AIOS_K8S_SUBDOMAIN to its name",
                )
            hosts = tuple(job_hostname(job, p, subdomain) for p in range(pods))
            node_rank = pod
        master = environ.get("MASTER_ADDR") or hosts[0]
        return ClusterInfo(
            name=self.name,
            nnodes=len(hosts),
            node_rank=node_rank,
            master_addr=master,
            master_port=_int(environ, "MASTER_PORT"),
            hosts=hosts,
        )


__all__ = ["KubernetesEnvironment", "job_hostname", "jobset_hostname"]
