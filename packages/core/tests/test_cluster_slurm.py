"""The Slurm cluster environment: host-list expansion as Slurm does it, and ranks/nodes/master
from the variables srun sets (the real-Slurm runs are in packages/cloud-slurm/tests)."""

from __future__ import annotations

import pytest
from aios.environments.slurm import SlurmEnvironment, expand_hostlist, expand_tasks_per_node
from aios.errors import ConfigError


@pytest.mark.parametrize(
    "hostlist, hosts",
    [
        ("node1", ["node1"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("node[01-03]", ["node01", "node02", "node03"]),
        ("node[098-101]", ["node098", "node099", "node100", "node101"]),
        ("node[1-2,5,07-08]", ["node1", "node2", "node5", "node07", "node08"]),
        ("rack[1-2]-gpu[01-02]", ["rack1-gpu01", "rack1-gpu02", "rack2-gpu01", "rack2-gpu02"]),
        ("a[1-2],b3,c[5-6]x", ["a1", "a2", "b3", "c5x", "c6x"]),
        ("login, cpu[9-10]", ["login", "cpu9", "cpu10"]),
        ("n[0]", ["n0"]),
        ("10.0.0.[1-2]", ["10.0.0.1", "10.0.0.2"]),
    ],
)
def test_expand_hostlist_like_scontrol_show_hostnames(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize("bad", ["node[1-3", "node1-3]", "node[a-b]", "node[3-1]"])
def test_malformed_hostlist_is_a_config_error(bad):
    with pytest.raises(ConfigError):
        expand_hostlist(bad)


def test_tasks_per_node_format():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("4") == [4]
    with pytest.raises(ConfigError):
        expand_tasks_per_node("2x3")


STEP = {
    "SLURM_JOB_ID": "1234",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_NNODES": "2",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "gpu[07-08]",
    "SLURM_STEP_NUM_NODES": "2",
}


def test_one_task_per_node_gives_node_rank_and_master_from_the_nodelist():
    env = {
        **STEP,
        "SLURM_PROCID": "1",
        "SLURM_NODEID": "1",
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_NTASKS_PER_NODE": "1",
    }
    se = SlurmEnvironment()
    assert se.detect(env)
    info = se.info(env)
    assert (info.nnodes, info.node_rank, info.master_addr, info.hosts) == (
        2,
        1,
        "gpu07",
        ("gpu07", "gpu08"),
    )
    assert info.rank is None and info.world_size is None  # aios-run starts the node's processes
    assert info.master_port == 15000 + 1234


def test_several_tasks_per_node_carry_the_process_rank():
    env = {
        **STEP,
        "SLURM_PROCID": "3",
        "SLURM_NODEID": "1",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS": "4",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_NTASKS_PER_NODE": "2",
    }
    info = SlurmEnvironment().info(env)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (3, 4, 1, 2)
    assert (info.nnodes, info.node_rank) == (2, 1)


def test_uneven_tasks_per_node_use_this_nodes_count():
    env = {
        **STEP,
        "SLURM_STEP_NODELIST": "n[1-3]",
        "SLURM_JOB_NODELIST": "n[1-3]",
        "SLURM_STEP_NUM_NODES": "3",
        "SLURM_NNODES": "3",
        "SLURM_PROCID": "4",
        "SLURM_NODEID": "2",
        "SLURM_LOCALID": "0",
        "SLURM_STEP_NUM_TASKS": "5",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2),1",
    }
    info = SlurmEnvironment().info(env)
    assert (info.local_world_size, info.world_size, info.rank) == (1, 5, 4)


def test_explicit_master_addr_and_port_win():
    env = {
        **STEP,
        "SLURM_PROCID": "0",
        "SLURM_NODEID": "0",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "MASTER_ADDR": "10.1.2.3",
        "MASTER_PORT": "29400",
    }
    info = SlurmEnvironment().info(env)
    assert (info.master_addr, info.master_port) == ("10.1.2.3", 29400)


def test_batch_script_of_a_multi_node_allocation_is_an_error_not_a_single_node_run():
    env = {
        "SLURM_JOB_ID": "9",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_NNODES": "2",
        "SLURM_PROCID": "0",
        "SLURM_NODEID": "0",
        "SLURM_NTASKS": "2",
    }
    with pytest.raises(ConfigError, match="srun"):
        SlurmEnvironment().info(env)
    one = {
        "SLURM_JOB_ID": "9",
        "SLURM_JOB_NODELIST": "node1",
        "SLURM_NNODES": "1",
        "SLURM_PROCID": "0",
        "SLURM_NODEID": "0",
    }
    assert SlurmEnvironment().info(one).nnodes == 1


def test_not_detected_outside_a_job_or_in_salloc_without_srun():
    se = SlurmEnvironment()
    assert not se.detect({})
    assert not se.detect({"SLURM_JOB_ID": "5", "SLURM_NNODES": "2"})  # salloc shell: no task


def test_nodelist_and_node_count_disagree():
    env = {**STEP, "SLURM_STEP_NUM_NODES": "3", "SLURM_PROCID": "0", "SLURM_NODEID": "0"}
    with pytest.raises(ConfigError, match="2 hosts"):
        SlurmEnvironment().info(env)


def _aios_run(tmp_path, env_extra, *args):
    import os
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIOS_", "SLURM_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_", "JOB_"))
    }
    env.update(env_extra)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "aios.cli.run",
            "--backend",
            "cpu",
            "--dry-run",
            "--json",
            *args,
            str(script),
        ],
        env=env,
        text=True,
        capture_output=True,
        timeout=120,
        cwd=tmp_path,
    )


SRUN_TASK = {
    "SLURM_JOB_ID": "77",
    "SLURM_STEP_ID": "0",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_STEP_NODELIST": "gpu[07-08]",
    "SLURM_NNODES": "2",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_PROCID": "1",
    "SLURM_NODEID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
}


def test_aios_run_takes_nodes_rank_and_master_from_the_slurm_step(tmp_path):
    import json

    r = _aios_run(tmp_path, SRUN_TASK)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    cmd = plan["hosts"][0]["command"]
    assert cmd[cmd.index("--nnodes") + 1] == "2" and cmd[cmd.index("--node-rank") + 1] == "1"
    assert cmd[cmd.index("--master-addr") + 1] == "gpu07" and cmd[
        cmd.index("--master-port") + 1
    ] == str(15000 + 77)
    assert plan["world_size"] == 2


def test_an_explicit_nnodes_that_contradicts_slurm_is_one_line_exit_2(tmp_path):
    r = _aios_run(tmp_path, SRUN_TASK, "--nnodes", "3")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "nnodes=3 contradicts the slurm job" in r.stderr
    ok = _aios_run(
        tmp_path, SRUN_TASK, "--nnodes", "2", "--master-addr", "10.0.0.1"
    )  # agreeing / address: explicit wins
    assert ok.returncode == 0 and "10.0.0.1" in ok.stdout


def test_several_tasks_per_node_run_the_script_directly_as_the_slurm_rank(tmp_path):
    import json

    env = {
        **SRUN_TASK,
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    }
    r = _aios_run(tmp_path, env)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["launcher"] == "direct" and plan["hosts"][0]["nprocs"] == 1
