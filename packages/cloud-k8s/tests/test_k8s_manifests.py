"""Every generated manifest conforms to the official Kubernetes OpenAPI schemas
(kubernetes-validate, strict) and the JobSet CRD's openAPIV3Schema (vendored), and carries what
GKE TPU / EKS scheduling needs."""

from __future__ import annotations

import jsonschema
import kubernetes_validate
import pytest
from aios_cloud_k8s import manifests as M

K8S_VERSION = "1.30.0"


def _req(accelerator: str, nodes: int, api: str = "jobset", secret: bool = True) -> M.JobRequest:
    return M.JobRequest(
        name="run1",
        namespace="ml",
        image="img:1",
        command=["python3", "-m", "aios.cli.run", "train.py"],
        place=M.placement(accelerator, nodes),
        api=api,
        env={"LOG_LEVEL": "debug"},
        secret_name="run1-env" if secret else None,
        code_configmap="run1-code",
        cpu="4",
        memory="16Gi",
    )


def _validate(objs, crd):
    for o in objs:
        if o["kind"] == "JobSet":
            jsonschema.validate(o, crd["openAPIV3Schema"])
        else:
            kubernetes_validate.validate(o, K8S_VERSION, strict=True)


def _pod(js):
    return js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


@pytest.mark.parametrize(
    "accelerator, nodes, api",
    [
        ("v5litepod-16", 2, "jobset"),
        ("v4-16", 1, "jobset"),
        ("v5p-32", 1, "jobset"),
        ("v6e-8", 1, "jobset"),
        ("trn1.32xlarge", 4, "jobset"),
        ("p5.48xlarge", 2, "job"),
        ("cpu", 2, "job"),
        ("cpu", 1, "jobset"),
    ],
)
def test_every_manifest_validates_against_the_official_schemas(accelerator, nodes, api, jobset_crd):
    objs = M.manifests(_req(accelerator, nodes, api), {"HF_TOKEN": "x"}, "Y29kZQ==")
    _validate(objs, jobset_crd)
    assert [o["kind"] for o in objs][:2] == ["Secret", "ConfigMap"]


def test_invalid_manifest_is_caught_by_the_schemas(jobset_crd):
    js = M.jobset(_req("v5litepod-16", 2))
    js["spec"]["replicatedJobs"][0]["replicas"] = "two"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(js, jobset_crd["openAPIV3Schema"])
    svc, job = M.indexed_job(_req("cpu", 2, "job"))
    job["spec"]["completionMode"] = 7
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)


def test_gke_tpu_multislice_jobset():
    js = M.jobset(_req("v5litepod-16", 2))
    assert js["metadata"]["annotations"] == {
        "alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"
    }
    rj = js["spec"]["replicatedJobs"][0]
    assert rj["replicas"] == 2  # two slices
    job = rj["template"]["spec"]
    assert (
        job["parallelism"] == job["completions"] == 4 and job["completionMode"] == "Indexed"
    )  # one pod per TPU host
    pod = _pod(js)
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
        "cloud.google.com/gke-tpu-topology": "4x4",
    }
    c = pod["containers"][0]
    assert c["resources"]["limits"] == {"google.com/tpu": "4"}
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
    assert (
        env["AIOS_K8S_PODS_PER_JOB"] == "4"
        and env["REPLICATED_JOB_REPLICAS"] == "2"
        and env["JOBSET_NAME"] == "run1"
    )
    assert env["JOB_INDEX"] == {
        "fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/job-index']"}
    }
    assert M.placement("v4-16", 1).node_selector["cloud.google.com/gke-tpu-topology"] == "2x2x2"
    assert M.placement("v6e-8", 1).resources == {"google.com/tpu": "8"}


def test_eks_trainium_and_gpu_resources_and_efa_env():
    js = M.jobset(_req("trn1.32xlarge", 4))
    c = _pod(js)["containers"][0]
    assert c["resources"]["limits"] == {"aws.amazon.com/neuron": "16", "vpc.amazonaws.com/efa": "8"}
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["FI_PROVIDER"] == "efa" and env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert _pod(js)["nodeSelector"] == {"node.kubernetes.io/instance-type": "trn1.32xlarge"}
    svc, job = M.indexed_job(_req("p5.48xlarge", 2, "job"))
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu": "8",
        "vpc.amazonaws.com/efa": "32",
    }
    assert (
        svc["spec"]["clusterIP"] == "None"
        and job["spec"]["template"]["spec"]["subdomain"] == svc["metadata"]["name"]
    )


def test_secrets_only_by_reference():
    objs = M.manifests(_req("cpu", 2), {"HF_TOKEN": "s3cr3t"}, "")
    secret = objs[0]
    assert secret["kind"] == "Secret" and secret["stringData"] == {"HF_TOKEN": "s3cr3t"}
    js = objs[-1]
    c = _pod(js)["containers"][0]
    assert c["envFrom"] == [{"secretRef": {"name": "run1-env"}}]
    assert "s3cr3t" not in str(js)


def test_bad_accelerators():
    from aios.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown accelerator"):
        M.placement("quantum-9", 1)
    with pytest.raises(ConfigError):
        M.indexed_job(_req("v5litepod-16", 2, "job"))


def test_pods_grace_matches_aios_and_gke_spot_caps_it_to_15s():
    """A pod's deletion is SIGTERM then SIGKILL after terminationGracePeriodSeconds; on GKE Spot
    nodes non-system pods get at most 15 s whatever the manifest asks
    (https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms#termination-graceful-shutdown).
    The manifest's grace and the ranks' (AIOS_RUN_GRACE_CAP) agree."""
    from aios.launcher.contract import GRACE_CAP_ENV
    from aios_cloud_k8s import manifests as M

    def pod(spot: bool, grace: float) -> dict:
        req = M.JobRequest(
            name="g",
            namespace="default",
            image="img",
            command=["python", "t.py"],
            place=M.placement("v5litepod-16", 1),
            api="jobset",
            grace_seconds=grace,
            spot=spot,
        )
        js = M.manifests(req, {}, "")[-1]
        return js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]

    on_demand = pod(False, 25.0)
    env = {e["name"]: e.get("value") for e in on_demand["containers"][0]["env"]}
    assert on_demand["terminationGracePeriodSeconds"] == 25 and env[GRACE_CAP_ENV] == "25"
    assert "cloud.google.com/gke-spot" not in on_demand["nodeSelector"]
    spot = pod(True, 25.0)
    env = {e["name"]: e.get("value") for e in spot["containers"][0]["env"]}
    assert spot["terminationGracePeriodSeconds"] == 15 and env[GRACE_CAP_ENV] == "15"
    assert spot["nodeSelector"]["cloud.google.com/gke-spot"] == "true"
    assert pod(True, 10.0)["terminationGracePeriodSeconds"] == 10


def _pod_of(objs):
    top = objs[-1]
    if top["kind"] == "JobSet":
        return _pod(top)
    return top["spec"]["template"]["spec"]


@pytest.mark.parametrize(
    "accelerator, nodes, api, memory, shm, want",
    [
        ("p5.48xlarge", 2, "job", None, None, "16Gi"),  # 2 GiB per GPU
        ("v5litepod-16", 1, "jobset", None, None, "8Gi"),  # 4 chips per pod
        ("cpu", 2, "job", "16Gi", None, "8192Mi"),  # half the memory request
        ("cpu", 1, "jobset", None, "1Gi", "1Gi"),  # k8s.shm_size
    ],
)
def test_every_pod_mounts_a_memory_backed_dev_shm(
    accelerator, nodes, api, memory, shm, want, jobset_crd
):
    """A container's /dev/shm is 64 MiB unless a volume replaces it: NCCL, DataLoader workers
    and the background checkpoint need more, and a k8s user cannot pass docker's --shm-size."""
    req = _req(accelerator, nodes, api)
    req.memory, req.shm_size = memory, shm
    objs = M.manifests(req, {}, "Y29kZQ==")
    _validate(objs, jobset_crd)
    pod = _pod_of(objs)
    mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
    vols = {v["name"]: v for v in pod["volumes"]}
    shm_vol = vols[mounts["/dev/shm"]]
    assert shm_vol["emptyDir"] == {"medium": "Memory", "sizeLimit": want}
    assert "/aios/code" in mounts  # the code volume is still there


def test_a_bad_shm_size_is_one_line():
    from aios.errors import ConfigError

    req = _req("cpu", 1)
    req.shm_size = "lots"
    with pytest.raises(ConfigError, match="k8s.shm_size='lots' is not a memory size"):
        M.manifests(req, {}, "")


def test_kueue_queue_label_on_the_job_and_the_jobset(jobset_crd):
    """Kueue reads the LocalQueue from metadata.labels of a Job and of a JobSet
    (https://kueue.sigs.k8s.io/docs/tasks/run/jobs/, .../run/jobsets/); not on the pods."""
    for accelerator, api in (("v5litepod-16", "jobset"), ("cpu", "job")):
        req = _req(accelerator, 1, api)
        req.queue = "team-a"
        objs = M.manifests(req, {}, "")
        _validate(objs, jobset_crd)
        top = objs[-1]
        assert top["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
        assert "kueue.x-k8s.io/queue-name" not in _pod_of(objs).get("metadata", {}).get(
            "labels", {}
        )
        req.queue = None
        assert "kueue.x-k8s.io/queue-name" not in M.manifests(req, {}, "")[-1]["metadata"]["labels"]


def test_indexed_job_retries_each_index_not_the_whole_job(jobset_crd):
    """backoffLimit counts failed pods over all indexes: one lost pod 0 and its peers failing
    with it spent --max-restarts at once. backoffLimitPerIndex counts per index
    (https://kubernetes.io/docs/concepts/workloads/controllers/job/#backoff-limit-per-index)."""
    req = _req("cpu", 4, "job")
    req.backoff_limit = 3
    svc, job = M.indexed_job(req)
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    spec = job["spec"]
    assert spec["backoffLimitPerIndex"] == 3 and spec["maxFailedIndexes"] == 0
    assert "backoffLimit" not in spec
    assert spec["completionMode"] == "Indexed"
    assert spec["template"]["spec"]["restartPolicy"] == "Never"  # the feature requires it


def test_eks_efa_env_follows_the_node_instance_types_generation():
    """AWS: RDMA read on Nitro v4+; g5 is Nitro v3. libfabric aborts with
    FI_EFA_USE_DEVICE_RDMA=1 on a device without RDMA read."""

    def env(accelerator):
        c = _pod(M.jobset(_req(accelerator, 2)))["containers"][0]
        return {e["name"]: e.get("value") for e in c["env"]}, c["resources"]["limits"]

    g5, g5_limits = env("g5.48xlarge")
    assert g5["FI_PROVIDER"] == "efa" and "FI_EFA_USE_DEVICE_RDMA" not in g5
    assert g5_limits["vpc.amazonaws.com/efa"] == "1"
    p5, p5_limits = env("p5.48xlarge")
    assert p5["FI_PROVIDER"] == "efa" and p5["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert p5_limits["vpc.amazonaws.com/efa"] == "32"
    g5_small, small_limits = env("g5.xlarge")  # no EFA on that size
    assert "FI_PROVIDER" not in g5_small and "vpc.amazonaws.com/efa" not in small_limits
