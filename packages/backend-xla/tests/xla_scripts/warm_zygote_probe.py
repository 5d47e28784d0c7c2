"""Drives aios-run's zygote (aios.launcher.warm.Zygote) the way aios-run does for an XLA plan and
prints what it answered, as JSON: usage ``warm_zygote_probe.py OUT_DIR``.

* ``preload``: the plan's modules with the plan's environment (PJRT_DEVICE, CPU_NUM_DEVICES:
  read when the runtime starts) are imported;
* ``rank``: a process forked after it, differing in ``CPU_NUM_DEVICES``, starts warm, finds
  its runtime not started, and the runtime it starts has that many devices; what ``import
  torch_xla`` writes into the environment is there as in a fresh process (``fresh_rank``);
* ``rank_flags``: one differing in ``XLA_FLAGS`` (read when torch_xla is imported) starts fresh
  (no process forked);
* ``preload_flags``, ``rank_after_flags``: a preload whose environment differs from the zygote's
  in ``XLA_FLAGS`` is refused, and the plan's processes start fresh;
* ``after_runtime``: a zygote whose preload started the XLA runtime forks nothing.
"""

import json
import os
import subprocess
import sys

from aios.launcher import warm
from aios_backend_xla.launch import RANK_MODULES, RANK_RUNTIME_ENV

out = sys.argv[1]
CHILD = """
import json, os, sys
import torch_xla
from aios.launcher import warm
with open(sys.argv[1], "w") as f:
    started = warm._xla_runtime_started()
    import torch_xla.runtime as xr
    json.dump({"warm": warm.is_rank(), "runtime": started,
               "devices": xr.global_runtime_device_count(),
               "env": {k: os.environ.get(k) for k in ("XLA_FLAGS", "PJRT_DYNAMIC_PLUGINS",
                                                      "PJRT_DEVICE", "TF_CPP_MIN_LOG_LEVEL")}}, f)
"""
child = os.path.join(out, "child.py")
with open(child, "w") as f:
    f.write(CHILD)
starts = os.path.join(out, "starts_runtime.py")
with open(starts, "w") as f:
    f.write(
        "import torch, torch_xla.core.xla_model as xm\n(torch.ones(2, device=xm.xla_device()) + 1).cpu()\n"
    )

base = {**os.environ, "PJRT_DEVICE": "CPU", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
report = {}


def rank(z, env, name):
    path = os.path.join(out, name + ".json")
    proc = z.spawn([sys.executable, "-u", child, path], env, None, None)
    if proc is None:
        return None
    proc.wait()
    with open(path) as f:
        return json.load(f)


def zygote():
    z = warm.Zygote.start()
    if warm.is_rank():
        warm.run_rank()
        sys.exit(0)
    assert z is not None, "no zygote: warm start off or a thread runs"
    return z


flags = {**base, "XLA_FLAGS": "--xla_dump_to=/tmp/x"}
z = zygote()
report["preload"] = z.preload(RANK_MODULES, base, RANK_RUNTIME_ENV)
report["rank"] = rank(z, {**base, "CPU_NUM_DEVICES": "2"}, "rank")
report["rank_flags"] = rank(z, flags, "flags")
z.close()
fresh = os.path.join(out, "fresh.json")
subprocess.run(
    [sys.executable, "-u", child, fresh], env={**base, "CPU_NUM_DEVICES": "2"}, check=True
)
with open(fresh) as f:
    report["fresh_rank"] = json.load(f)

z = zygote()
report["preload_flags"] = z.preload(RANK_MODULES, flags, RANK_RUNTIME_ENV)
report["rank_after_flags"] = rank(z, flags, "after_flags")
z.close()

sys.path.insert(0, out)  # the zygote finds starts_runtime there
z = zygote()
report["preload_runtime"] = z.preload(["starts_runtime"], base, RANK_RUNTIME_ENV)
report["after_runtime"] = rank(z, base, "after")
z.close()
print(json.dumps(report))
