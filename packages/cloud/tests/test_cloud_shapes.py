"""The shapes a run had (issue 26) as the run record keeps them, and the option checks of runs
that follow capacity (``-a`` candidates, ``--cheapest``, ``--min-hosts``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from aios.errors import AiosError
from aios_cloud import shapes
from aios_cloud.request import LaunchRequest
from aios_cloud.store import ClusterRecord, Store


def _rec(store: Store, accelerator: str, hosts: int) -> ClusterRecord:
    rec = ClusterRecord("run", "aws", "us-east-1a", accelerator, True, "READY")
    store.claim_cluster(rec)
    store.update_cluster(
        "run", accelerator=accelerator, hosts=[{"worker_id": i} for i in range(hosts)]
    )
    got = store.get_cluster("run")
    assert got is not None
    return got


def test_each_shape_with_its_steps_time_and_cost(tmp_path):
    store = Store(tmp_path / "state.db")
    rec = _rec(store, "p5.48xlarge", 2)
    job = store.add_job("run", "train.py", managed=True, max_restarts=2)
    shapes.begin(store, rec, job, 16, 62.92, None, "launched")
    shapes.end(store, rec, job, 40, "preempted")
    shapes.end(store, rec, job, 41, "again")  # an ended shape is not ended twice
    store.update_cluster("run", accelerator="trn1.32xlarge", hosts=[{"worker_id": 0}])
    rec = store.get_cluster("run")
    assert rec is not None
    shapes.begin(store, rec, job, 32, None, 40, "recovery 1/2")
    other = store.add_job("run", "other.py")
    shapes.begin(store, rec, other, 1, 1.0, None, "launched")  # another job's: not this one's
    started = store.events("run", kind=shapes.SHAPE)[1].time
    got = shapes.job_shapes(store, "run", job, now=lambda: started + 1800)
    assert [(s["accelerator"], s["hosts"], s["processes"]) for s in got] == [
        ("p5.48xlarge", 2, 16),
        ("trn1.32xlarge", 1, 32),
    ]
    first, second = got
    assert (first["from_step"], first["to_step"], first["steps"]) == (None, 40, 40)
    assert first["ended"] is not None and first["end"] == "preempted"
    assert first["cost_usd"] == round(62.92 * first["seconds"] / 3600, 4)
    # the running shape: up to now, no steps known yet, no price in the catalog
    assert second["ended"] is None and second["seconds"] == 1800.0
    assert (second["from_step"], second["to_step"], second["steps"]) == (40, None, None)
    assert second["cost_usd"] is None
    assert shapes.describe(second) == (
        "trn1.32xlarge x 1 hosts, 32 processes: from step 40, 30.0 min, running, "
        "no price in the catalog"
    )
    line = shapes.describe(first)
    assert line.startswith("p5.48xlarge x 2 hosts, 16 processes: steps 0->40 (40), ")
    assert line.endswith(f"{shapes.money(first['cost_usd'])} at $62.92/h")
    # a shape that never ended (its watcher died) ends where the next one starts
    shapes.begin(store, rec, job, 8, None, 50, "recovery 2/2")
    got = shapes.job_shapes(store, "run", job)
    assert got[1]["ended"] == store.events("run", kind=shapes.SHAPE)[3].time
    store.close()


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"accelerator": "a,,b"}, "empty entry"),
        ({"accelerator": "a,b,a"}, "lists a more than once"),
        ({"accelerator": "a", "cheapest": True}, "--cheapest"),
        ({"min_hosts": 0, "max_restarts": 1}, "at least 1"),
        ({"min_hosts": 2}, "managed run"),
    ],
)
def test_candidate_and_host_options_are_checked_once(tmp_path, options, words):
    (tmp_path / "t.py").write_text("")
    with pytest.raises(AiosError) as err:
        LaunchRequest.from_options({"script": "t.py", "workdir": str(tmp_path), **options})
    assert words in err.value.message


def test_candidates_keep_their_order():
    req = LaunchRequest("t.py", accelerator="v6e-16, v5litepod-16,v5litepod-8")
    assert req.candidates == ["v6e-16", "v5litepod-16", "v5litepod-8"]


def test_min_hosts_above_the_host_list_is_one_line(tmp_path):
    (tmp_path / "t.py").write_text("")
    r = subprocess.run(
        [sys.executable, "-m", "aios.cli.main", "launch", "--cloud", "ssh", "--hosts", "a,b"]
        + ["--min-hosts", "3", "--max-restarts", "1", "--checkpoint-dir", "/shared/ckpt"]
        + ["--workdir", str(tmp_path), "--dry-run", "t.py"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "AIOS_HOME": str(tmp_path / "home")},
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "aios: error: --min-hosts 3 is more than the 2 hosts listed; pass --min-hosts 2 or less"
    ]
