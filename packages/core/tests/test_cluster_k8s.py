"""The Kubernetes cluster environment: JobSet and indexed-Job pods (node rank, hosts, master)."""

from __future__ import annotations

import pytest
from aios.environments.k8s import KubernetesEnvironment, job_hostname, jobset_hostname
from aios.errors import ConfigError


def test_jobset_multislice_ranks_and_headless_hostnames():
    env = {
        "JOB_COMPLETION_INDEX": "1",
        "JOB_INDEX": "1",
        "JOBSET_NAME": "train",
        "REPLICATED_JOB_NAME": "slice",
        "REPLICATED_JOB_REPLICAS": "2",
        "AIOS_K8S_PODS_PER_JOB": "4",
        "HOSTNAME": "train-slice-1-1",
    }
    ke = KubernetesEnvironment()
    assert ke.detect(env)
    info = ke.info(env)
    assert info.nnodes == 8 and info.node_rank == 5
    assert info.master_addr == "train-slice-0-0.train"  # JobSet's default subdomain is its name
    assert info.hosts[5] == "train-slice-1-1.train"
    assert jobset_hostname("a", "b", 2, 3, "svc") == "a-b-2-3.svc"


def test_jobset_replicated_job_name_from_hostname_and_custom_subdomain():
    env = {
        "JOB_COMPLETION_INDEX": "0",
        "JOB_INDEX": "0",
        "JOBSET_NAME": "my-run",
        "AIOS_K8S_PODS_PER_JOB": "2",
        "HOSTNAME": "my-run-work-ers-0-0",
        "AIOS_K8S_SUBDOMAIN": "net",
    }
    info = KubernetesEnvironment().info(env)
    assert info.hosts == ("my-run-work-ers-0-0.net", "my-run-work-ers-0-1.net")
    assert info.node_rank == 0 and info.nnodes == 2


def test_indexed_job_with_subdomain():
    env = {
        "JOB_COMPLETION_INDEX": "2",
        "AIOS_K8S_PODS_PER_JOB": "3",
        "HOSTNAME": "llm-2",
        "AIOS_K8S_SUBDOMAIN": "llm-svc",
    }
    info = KubernetesEnvironment().info(env)
    assert (info.nnodes, info.node_rank, info.master_addr) == (3, 2, "llm-0.llm-svc")
    assert job_hostname("j", 4, "s") == "j-4.s"


def test_missing_facts_are_one_line_errors():
    ke = KubernetesEnvironment()
    with pytest.raises(ConfigError, match="AIOS_K8S_PODS_PER_JOB"):
        ke.info({"JOB_COMPLETION_INDEX": "0"})
    with pytest.raises(ConfigError, match="subdomain"):
        ke.info({"JOB_COMPLETION_INDEX": "0", "AIOS_K8S_PODS_PER_JOB": "2", "HOSTNAME": "x-0"})
    with pytest.raises(ConfigError, match="outside"):
        ke.info({"JOB_COMPLETION_INDEX": "5", "AIOS_K8S_PODS_PER_JOB": "2"})
    assert not ke.detect({"HOSTNAME": "x"})
