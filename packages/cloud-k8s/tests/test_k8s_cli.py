"""``aios launch --cloud k8s`` end to end through the real ``kubernetes`` client against a local
service that answers as the API server does (validating every object with the official schemas):
create, status, logs, cancel, down, catalog, cost, dry-run, and bad input."""

from __future__ import annotations

import base64
import json

import pytest
import yaml


def _one_line_error(r) -> str:
    assert r.returncode == 2, r.stdout + r.stderr
    errors = [ln for ln in r.stderr.splitlines() if "error" in ln.lower()]
    assert (
        len(errors) == 1 and errors[0].startswith("aios: error: ") and "Traceback" not in r.stderr
    ), r.stderr
    return errors[0]


def test_launch_tpu_multislice_jobset_status_logs_down(
    kube, k8s_env, run_aios, project, monkeypatch
):
    env = k8s_env(kube, HF_TOKEN="s3cr3t-token")
    r = run_aios(
        env,
        "launch",
        "--cloud",
        "k8s",
        "-a",
        "v5litepod-16",
        "--nodes",
        "1",
        "--name",
        "tpu1",
        "--workdir",
        str(project),
        "--env",
        "HF_TOKEN",
        "--env",
        "LOG_LEVEL=info",
        "--max-restarts",
        "2",
        "--checkpoint-dir",
        "gs://b/ckpt",
        "--detach",
        "train.py",
        "--",
        "--steps",
        "3",
    )
    assert r.returncode == 0, r.stderr
    js = kube.get("JobSet", "tpu1")
    assert (
        js is not None and js["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] == 4
    )
    assert js["spec"]["failurePolicy"] == {
        "maxRestarts": 2
    }  # --max-restarts: the whole set restarts and resumes
    secret = kube.get("Secret", "tpu1-env")
    assert base64.b64decode(secret["data"]["HF_TOKEN"]).decode() == "s3cr3t-token"
    assert "s3cr3t-token" not in json.dumps(js)
    code = kube.get("ConfigMap", "tpu1-code")
    import io
    import tarfile

    names = tarfile.open(
        fileobj=io.BytesIO(base64.b64decode(code["binaryData"]["code.tar.gz"]))
    ).getnames()
    assert "train.py" in names and not any(n.startswith("data") for n in names)
    pods = kube.of_kind("Pod")
    assert sorted(p["spec"]["hostname"] for p in pods) == [f"tpu1-slice-0-{i}" for i in range(4)]
    st = json.loads(run_aios(env, "status", "--refresh", "--json").stdout)
    assert st[0]["cloud"] == "k8s" and st[0]["state"] == "RUNNING"  # the 4 pods were scheduled
    kube.finish("tpu1", logs={0: "gpt: done 3 steps\n", 1: "rank 1 ok\n"})
    st = json.loads(run_aios(env, "status", "--refresh", "--json").stdout)
    assert st[0]["state"] == "COMPLETED"
    logs = run_aios(env, "logs", "tpu1")
    assert (
        logs.returncode == 0 and "gpt: done 3 steps" in logs.stdout and "rank 1 ok" in logs.stdout
    )
    assert "(tpu1-slice-0-0-" in logs.stdout
    r = run_aios(env, "down", "tpu1")
    assert r.returncode == 0, r.stderr
    assert (
        kube.of_kind("JobSet") == []
        and kube.of_kind("Secret") == []
        and kube.of_kind("ConfigMap") == []
        and kube.of_kind("Pod") == []
    )
    assert json.loads(run_aios(env, "status", "--json").stdout) == []


def test_launch_indexed_job_follows_to_completion_and_cancel(kube, k8s_env, run_aios, project):
    env = k8s_env(kube, AIOS_K8S__API="job")
    r = run_aios(
        env,
        "launch",
        "--cloud",
        "k8s",
        "-a",
        "cpu",
        "--nodes",
        "2",
        "--name",
        "cpu2",
        "--workdir",
        str(project),
        "--detach",
        "train.py",
    )
    assert r.returncode == 0, r.stderr
    assert kube.get("Job", "cpu2") and kube.get("Service", "cpu2")["spec"]["clusterIP"] == "None"
    assert kube.get("Secret", "cpu2-env") is None  # nothing forwarded: no Secret
    r = run_aios(env, "cancel", "cpu2")
    assert r.returncode == 0, r.stderr
    assert (
        kube.get("Job", "cpu2") is None
        and kube.get("Service", "cpu2") is None
        and kube.of_kind("Pod") == []
    )
    st = json.loads(run_aios(env, "status", "--json").stdout)
    assert st[0]["jobs"][-1]["state"] == "CANCELLED"


def test_dry_run_prints_yaml_without_secrets_and_creates_nothing(kube, k8s_env, run_aios, project):
    env = k8s_env(kube, HF_TOKEN="s3cr3t-token")
    r = run_aios(
        env,
        "launch",
        "--cloud",
        "k8s",
        "-a",
        "trn1.32xlarge",
        "--nodes",
        "2",
        "--name",
        "dry",
        "--workdir",
        str(project),
        "--env",
        "HF_TOKEN",
        "--dry-run",
        "train.py",
    )
    assert r.returncode == 0, r.stderr
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    assert [d["kind"] for d in docs] == ["Secret", "ConfigMap", "JobSet"]
    assert "s3cr3t-token" not in r.stdout
    assert (
        docs[2]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][
            0
        ]["resources"]["limits"]["aws.amazon.com/neuron"]
        == "16"
    )
    assert kube.requests == []  # not even a GET


def test_catalog_lists_node_pools_and_cost_says_not_applicable(kube, k8s_env, run_aios):
    env = k8s_env(kube)
    r = run_aios(env, "catalog", "--cloud", "k8s", "--json")
    assert r.returncode == 0, r.stderr
    pools = {e["accelerator"]: e for e in json.loads(r.stdout)}
    assert (
        pools["tpu-v5e-16"]["hosts"] == 4
        and pools["tpu-v5e-16"]["devices"] == 16
        and pools["tpu-v5e-16"]["backend"] == "xla"
    )
    assert pools["default-pool"]["devices"] == 7
    r = run_aios(env, "cost", "--cloud", "k8s", "-a", "tpu-v5e-16", "--hours", "3")
    assert r.returncode == 0, r.stderr
    assert "on-demand n/a (your cluster)" in r.stdout


def test_bad_input_one_line_exit_2_nothing_left(kube, kube_no_crd, k8s_env, run_aios, project):
    base = ["launch", "--cloud", "k8s", "--workdir", str(project), "--name", "bad", "--detach"]
    line = _one_line_error(run_aios(k8s_env(None), *base, "-a", "cpu", "train.py"))
    assert "no usable kubeconfig" in line
    line = _one_line_error(
        run_aios(
            k8s_env(kube_no_crd), *base, "-a", "cpu", "--nodes", "2", "--env", "HOME", "train.py"
        )
    )
    assert "JobSet CRD" in line and "k8s.api=job" in line
    assert kube_no_crd.objects == {}  # the Secret and ConfigMap made before the JobSet were deleted
    line = _one_line_error(run_aios(k8s_env(kube), *base, "-a", "v5litepod-8", "train.py"))
    assert "no node pool offers v5litepod-8" in line and "4x4" in line
    line = _one_line_error(
        run_aios(k8s_env(kube, AIOS_K8S__IMAGE=""), *base, "-a", "cpu", "train.py")
    )
    assert "k8s.image" in line
    assert kube.objects == {}
    assert json.loads(run_aios(k8s_env(kube), "status", "--json").stdout) == []


def test_an_object_the_api_server_rejects_rolls_back_what_was_created(kube, tmp_path):
    import pytest
    from aios_cloud.provider.errors import CloudError
    from aios_cloud_k8s import manifests as M
    from aios_cloud_k8s.provider import K8sProvider
    from aios_cloud_k8s.settings import K8sSettings

    provider = K8sProvider(None)
    provider.settings = K8sSettings(kubeconfig=str(kube.kubeconfig(tmp_path / "kc")), image="img:1")
    req = M.JobRequest(
        name="rej",
        namespace="default",
        image="img:1",
        command=["true"],
        place=M.placement("cpu", 2),
        api="jobset",
        secret_name="rej-env",
        code_configmap="rej-code",
    )
    objs = M.manifests(req, {"A_TOKEN": "x"}, "")
    objs[-1]["spec"]["replicatedJobs"][0]["replicas"] = "two"  # the CRD schema says integer
    with pytest.raises(CloudError, match="the API server rejected JobSet rej"):
        provider.apply(objs)
    assert kube.objects == {}
    assert ("DELETE", "/api/v1/namespaces/default/secrets/rej-env") in kube.requests


def test_tpu7x_dry_run_is_applyable_as_printed(kube, k8s_env, run_aios, project):
    """TPU7x goes through GKE (the TPU API does not serve it); the printed manifest carries the
    real toleration key and node labels (https://cloud.google.com/kubernetes-engine/docs/concepts/tpu-ironwood),
    while secret values stay hidden."""
    env = k8s_env(kube, HF_TOKEN="s3cr3t-token")
    r = run_aios(
        env,
        *("launch", "--cloud", "k8s", "-a", "tpu7x-8", "--name", "iw", "--workdir", str(project)),
        *("--env", "HF_TOKEN", "--env", "MODEL_NAME=gpt-small", "--dry-run", "train.py"),
    )
    assert r.returncode == 0, r.stderr
    assert "s3cr3t-token" not in r.stdout and "'***'" not in r.stdout
    assert "<forwarded from your environment>" in r.stdout and "gpt-small" in r.stdout
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    pod = docs[-1]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["tolerations"] == [
        {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu7x",
        "cloud.google.com/gke-tpu-topology": "2x2x1",
    }
    assert pod["containers"][0]["resources"]["limits"]["google.com/tpu"] == "4"
    assert kube.requests == []


def _tpu_node(name: str, topology: str, machine: str, chips: int) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "cloud.google.com/gke-nodepool": f"pool-{machine}",
                "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                "cloud.google.com/gke-tpu-topology": topology,
                "node.kubernetes.io/instance-type": machine,
            },
        },
        # GKE taints TPU nodes; pods tolerate google.com/tpu
        "spec": {"taints": [{"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}]},
        "status": {"allocatable": {"cpu": "170", "google.com/tpu": str(chips)}},
    }


def _launch_v6e8(run_aios, env, project, name):
    return run_aios(
        env,
        *("launch", "--cloud", "k8s", "-a", "v6e-8", "--name", name),
        *("--workdir", str(project), "--detach", "train.py"),
    )


def test_v6e_2x4_pool_of_4_chip_nodes_gets_two_pods_per_slice(
    jobset_crd, k8s_env, run_aios, project
):
    """https://cloud.google.com/tpu/docs/v6e: 2x4 is one ct6e-standard-8t VM or two
    ct6e-standard-4t VMs. On a pool of 4-chip nodes a pod asking google.com/tpu: 8 never
    schedules (the stand-in's scheduler, as kube-scheduler, leaves it Pending): the pods follow the
    pool, and a pool that cannot hold the slice is refused in one line."""
    from aios_cloud_k8s.testing import FakeKubeApi

    nodes = [_tpu_node(f"v6e-4t-{i}", "2x4", "ct6e-standard-4t", 4) for i in range(2)]
    with FakeKubeApi(nodes=nodes, jobset_crd=jobset_crd) as kube:
        env = k8s_env(kube)
        r = _launch_v6e8(run_aios, env, project, "six")
        assert r.returncode == 0, r.stderr
        assert "2 pods per slice" in r.stderr, r.stderr
        rj = kube.get("JobSet", "six")["spec"]["replicatedJobs"][0]["template"]["spec"]
        assert rj["parallelism"] == 2
        limits = rj["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert limits["google.com/tpu"] == "4"
        pods = kube.of_kind("Pod")
        assert [p["status"]["phase"] for p in pods] == ["Running", "Running"]
        assert sorted(p["spec"]["nodeName"] for p in pods) == ["v6e-4t-0", "v6e-4t-1"]
        st = json.loads(run_aios(env, "status", "--refresh", "--json").stdout)
        assert st[0]["state"] == "RUNNING"
        assert run_aios(env, "down", "six").returncode == 0
    # a 2x4 pool whose nodes hold 2 chips each fits neither layout: one line, nothing created
    nodes = [_tpu_node(f"odd-{i}", "2x4", "ct6e-standard-2t", 2) for i in range(4)]
    with FakeKubeApi(nodes=nodes, jobset_crd=jobset_crd) as kube:
        env = k8s_env(kube)
        line = _one_line_error(_launch_v6e8(run_aios, env, project, "odd"))
        assert "no node pool fits v6e-8: its pods ask google.com/tpu: 8 or 4 per node" in line
        assert "(ct6e-standard-2t) hold 2" in line and kube.of_kind("JobSet") == []


def test_a_pod_no_node_can_hold_is_reported_pending_with_the_schedulers_reason(
    jobset_crd, k8s_env, run_aios, project
):
    """A JobSet's ``active`` counts pending pods (its Jobs' ``active``: "pending and running
    pods", https://kubernetes.io/docs/concepts/workloads/controllers/job/); aios reads the pods."""
    from aios_cloud_k8s.testing import FakeKubeApi

    nodes = [_tpu_node("v6e-8t-0", "2x4", "ct6e-standard-8t", 8)]
    with FakeKubeApi(nodes=nodes, jobset_crd=jobset_crd) as kube:
        env = k8s_env(kube)
        assert _launch_v6e8(run_aios, env, project, "first").returncode == 0
        assert _launch_v6e8(run_aios, env, project, "second").returncode == 0  # the pool is full
        js = kube.get("JobSet", "second")
        assert js["status"]["replicatedJobsStatus"][0]["active"] == 1  # as the controller says
        st = {
            c["name"]: c for c in json.loads(run_aios(env, "status", "--refresh", "--json").stdout)
        }
        assert st["first"]["state"] == "RUNNING" and st["second"]["state"] == "PENDING"
        pending = [p for p in kube.of_kind("Pod") if p["status"]["phase"] == "Pending"]
        msg = pending[0]["status"]["conditions"][0]["message"]
        assert msg == "0/1 nodes are available: 1 Insufficient google.com/tpu."


_JOB_PATHS = {
    "job": "/apis/batch/v1/namespaces/default/jobs/{}",
    "jobset": "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/{}",
}
_CPU_NODES = [
    {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": f"cpu-{i}", "labels": {"node.kubernetes.io/instance-type": "e2-8"}},
        "status": {"allocatable": {"cpu": "8", "memory": "32Gi"}},
    }
    for i in range(2)
]


def _launch_cpu(run_aios, env, project, name, nodes, *extra):
    return run_aios(
        env,
        *("launch", "--cloud", "k8s", "-a", "cpu", "--nodes", str(nodes), "--name", name),
        *("--workdir", str(project), *extra, "train.py"),
        timeout=60,
    )


@pytest.mark.parametrize(
    "api, nodes, kind, reason",
    [("job", 1, "Job", "(JobSuspended: Job suspended)"), ("jobset", 2, "JobSet", "(SuspendedJobs")],
)
def test_a_job_kueue_holds_is_reported_suspended_within_one_poll_and_runs_with_k8s_queue(
    api, nodes, kind, reason, jobset_crd, k8s_env, run_aios, project
):
    """Where Kueue manages jobs without a queue name, such a job is created suspended and never
    admitted (https://kueue.sigs.k8s.io/docs/tasks/manage/enforce_job_management/manage_jobs_without_queue_name/):
    the follow loop says so, with the reason and the fix, at its first poll and stops; status
    says the same. With k8s.queue naming a LocalQueue, Kueue admits it and it runs."""
    from aios_cloud_k8s.testing import FakeKubeApi, Kueue

    with FakeKubeApi(
        nodes=_CPU_NODES, jobset_crd=jobset_crd, kueue=Kueue(local_queues=["team-a"])
    ) as kube:
        env = k8s_env(kube, AIOS_K8S__API=api)
        r = _launch_cpu(run_aios, env, project, "held", nodes)
        assert r.returncode == 1, r.stdout + r.stderr
        said = [ln for ln in r.stdout.splitlines() if ln.startswith("[aios] suspended: ")]
        assert len(said) == 1, r.stdout
        assert f"{kind} held is suspended {reason}" in said[0]
        assert "set k8s.queue to a LocalQueue of namespace default" in said[0]
        polls = [q for q in kube.requests if q == ("GET", _JOB_PATHS[api].format("held"))]
        assert len(polls) == 1  # reported at the first poll
        assert kube.get(kind, "held")["spec"]["suspend"] is True and kube.of_kind("Pod") == []
        st = json.loads(run_aios(env, "status", "--refresh", "--json").stdout)
        state = {c["name"]: c["state"] for c in st}["held"]
        assert state.startswith(f"SUSPENDED: {kind} held is suspended") and "k8s.queue" in state

        # a LocalQueue that does not exist: Kueue's Workload says why, status shows it
        env_b = k8s_env(kube, AIOS_K8S__API=api, AIOS_K8S__QUEUE="team-b")
        assert _launch_cpu(run_aios, env_b, project, "wrongq", nodes, "--detach").returncode == 0
        st = json.loads(run_aios(env_b, "status", "--refresh", "--json").stdout)
        state = {c["name"]: c["state"] for c in st}["wrongq"]
        assert "Kueue: LocalQueue team-b doesn't exist" in state
        assert "waits for Kueue to admit it through LocalQueue team-b" in state

        # with k8s.queue: labelled, admitted, running, and followed to completion
        env_a = k8s_env(kube, AIOS_K8S__API=api, AIOS_K8S__QUEUE="team-a")
        assert _launch_cpu(run_aios, env_a, project, "queued", nodes, "--detach").returncode == 0
        top = kube.get(kind, "queued")
        assert top["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
        assert top["spec"]["suspend"] is False
        pods = [
            p for p in kube.of_kind("Pod") if p["metadata"]["labels"]["aios-cluster"] == "queued"
        ]
        assert len(pods) == nodes and all(p["status"]["phase"] == "Running" for p in pods)
        st = json.loads(run_aios(env_a, "status", "--refresh", "--json").stdout)
        assert {c["name"]: c["state"] for c in st}["queued"] == "RUNNING"
        kube.finish("queued", logs={0: "trained\n"})
        logs = run_aios(env_a, "logs", "queued", "-f", timeout=60)
        assert logs.returncode == 0 and "trained" in logs.stdout, logs.stdout + logs.stderr
        assert run_aios(env_b, "down", "wrongq").returncode == 0
        assert kube.get(kind, "wrongq") is None and len(kube.of_kind("Workload")) == 1


def test_pods_get_a_memory_backed_dev_shm_not_the_64_mib_default(kube, k8s_env, run_aios, project):
    """The stand-in, as a container runtime, gives /dev/shm 64 MiB unless a memory-backed
    emptyDir is mounted there; aios mounts one on every pod (k8s.shm_size, or its default)."""
    env = k8s_env(kube, AIOS_K8S__API="job")
    assert _launch_cpu(run_aios, env, project, "shm1", 1, "--detach").returncode == 0
    (pod,) = kube.of_kind("Pod")
    assert kube.dev_shm_bytes(pod) == 2 * 2**30  # one CPU pod: 2 GiB
    env = k8s_env(kube, AIOS_K8S__API="job", AIOS_K8S__SHM_SIZE="512Mi")
    assert _launch_cpu(run_aios, env, project, "shm2", 1, "--detach").returncode == 0
    pod = next(p for p in kube.of_kind("Pod") if p["metadata"]["labels"]["aios-cluster"] == "shm2")
    assert kube.dev_shm_bytes(pod) == 512 * 2**20
    bare = {"spec": {"containers": [{"name": "c"}]}}
    assert kube.dev_shm_bytes(bare) == 64 * 2**20  # no volume: the runtime's default
