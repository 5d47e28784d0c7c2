"""aios --backend neuron against hand-written loops, side by side (no Trainium needed).

    /work/venvs/xla/bin/python bench/bench_neuron.py [--steps 200] [--repeats 3] [--skip-fresh] [--json OUT]
    /work/venvs/main/bin/python bench/bench_neuron.py --skip-steps      # planning part only, no torch_xla

1. **Step path** on the real torch_xla (XLA:CPU standing in for NeuronCores through
   ``AIOS_TEST_NEURON_ON_XLA_CPU=1``, discovery from a recorded trn1.2xlarge ``neuron-ls``
   capture through a stand-in tool on PATH). The model, data and hand-written torch_xla loop are
   backend-xla's benchmark's (``bench/bench_xla.py``: small tied-weight GPT, short last batch).

   a. *Interleaved, one process* (the step-time figure): the hand-written torch-neuronx-style
      loop and the same model through ``aios.init`` / ``rt.setup`` / ``rt.backward`` /
      ``rt.step`` with ``--backend neuron`` (``NeuronXlaStrategy``) alternate in blocks of 10
      steps, so machine noise hits both alike. Budget: aios-neuron <= 1.03x hand.
   b. *Fresh processes* (``--repeats`` times, interleaved; skip with ``--skip-fresh``):
      ``hand``, ``aios-xla`` (backend-xla's ``XlaStrategy``) and ``aios-neuron`` each compile
      from a cold cache. Budgets for aios-neuron against hand: the same uncached compilations,
      no recompiles after warm-up, the same final loss. (Their wall times are reported too but
      are noisy on a shared machine.)

2. **Planning cost** (no torch): building the launch plan for trn2.48xlarge x 2 nodes with the
   neuron backend against core's ``elastic_plan`` for the same 128 workers (the baseline), in one
   process, interleaved; and the import time of the plugin module.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIXTURE = (
    HERE.parent
    / "packages"
    / "backend-neuron"
    / "tests"
    / "fixtures"
    / "neuron_ls_trn1.2xlarge.json"
)


def _bench_xla():
    spec = importlib.util.spec_from_file_location("bench_xla", HERE / "bench_xla.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def worker_neuron(steps: int, backend: str) -> dict:
    import aios
    import torch

    bx = _bench_xla()
    cfg = {
        "backend": backend,
        "seed": 0,
        "logging": {
            "run_dir": tempfile.mkdtemp(prefix="aios-bench-"),
            "progress": False,
            "tensorboard": False,
        },
    }
    if backend == "xla":
        cfg["xla"] = {"allow_cpu": True}
    rt = aios.init(config=cfg)
    model, ds = bx.build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(ds, batch_size=bx.BATCH, shuffle=False)
    model, opt, loader = rt.setup(model, opt, loader)
    clock = bx.Clock(steps)
    while rt.global_step < steps:
        for x, y in loader:
            with rt.autocast():
                loss = bx.loss_fn(model(x), y)
            rt.backward(loss)
            rt.step(opt)
            clock.step(rt.global_step)
            if rt.global_step >= steps:
                break
    out = clock.result(float(loss.item()))
    out["strategy"] = type(rt.strategy).__name__
    rt.close()
    return out


def worker_interleaved(steps: int, block: int = 10) -> dict:
    """hand and aios-neuron in ONE process, alternating blocks of ``block`` steps, so machine
    noise hits both alike. Each block ends with ``wait_device_ops``; medians per step."""
    import aios
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.parallel_loader as pl

    bx = _bench_xla()
    rt = aios.init(
        config={
            "backend": "neuron",
            "seed": 0,
            "logging": {
                "run_dir": tempfile.mkdtemp(prefix="aios-bench-"),
                "progress": False,
                "tensorboard": False,
            },
        }
    )
    # hand-written torch-neuronx style loop
    device = torch_xla.device()
    h_model, ds = bx.build()
    h_model = h_model.to(device)
    h_model.head.weight = h_model.tok.weight
    h_opt = torch.optim.AdamW(h_model.parameters(), lr=1e-3)
    h_iter = iter(
        pl.MpDeviceLoader(
            torch.utils.data.DataLoader(ds, batch_size=bx.BATCH, shuffle=False, drop_last=True),
            device,
        )
    )
    # the same through aios
    a_model, ds2 = bx.build()
    a_opt = torch.optim.AdamW(a_model.parameters(), lr=1e-3)
    a_model, a_opt, a_loader = rt.setup(
        a_model, a_opt, torch.utils.data.DataLoader(ds2, batch_size=bx.BATCH, shuffle=False)
    )
    a_iter = iter(a_loader)
    loaders = {
        "hand": [
            h_iter,
            lambda: iter(
                pl.MpDeviceLoader(
                    torch.utils.data.DataLoader(
                        ds, batch_size=bx.BATCH, shuffle=False, drop_last=True
                    ),
                    device,
                )
            ),
        ],
        "aios": [a_iter, lambda: iter(a_loader)],
    }

    def batch(name):
        try:
            return next(loaders[name][0])
        except StopIteration:
            loaders[name][0] = loaders[name][1]()
            return next(loaders[name][0])

    def hand_step():
        x, y = batch("hand")
        loss = bx.loss_fn(h_model(x), y)
        loss.backward()
        h_opt.step()
        h_opt.zero_grad(set_to_none=True)
        torch_xla.sync()
        return loss

    def aios_step():
        x, y = batch("aios")
        with rt.autocast():
            loss = bx.loss_fn(a_model(x), y)
        rt.backward(loss)
        rt.step(a_opt)
        return loss

    for _ in range(5):  # warm-up: compile both
        hand_step()
        aios_step()
    xm.wait_device_ops()
    times = {"hand": [], "aios": []}
    fns = {"hand": hand_step, "aios": aios_step}
    for b in range(max(2, steps // block)):
        for name in ("hand", "aios") if b % 2 == 0 else ("aios", "hand"):
            t = time.perf_counter()
            for _ in range(block):
                fns[name]()
            xm.wait_device_ops()
            times[name].append((time.perf_counter() - t) / block * 1000)
    out = {n: statistics.median(v) for n, v in times.items()}
    out["blocks"] = len(times["hand"])
    out["strategy"] = type(rt.strategy).__name__
    rt.close()
    return out


def worker(name: str, steps: int) -> dict:
    if name == "interleaved":
        return worker_interleaved(steps)
    if name == "hand":
        return _bench_xla().worker_hand(steps)
    return worker_neuron(steps, "neuron" if name == "aios-neuron" else "xla")


def _fake_neuron_ls(tmp: str) -> str:
    tool = Path(tmp) / "neuron-ls"
    tool.write_text(
        f"#!{sys.executable}\nimport sys\nsys.stdout.write(open({str(FIXTURE)!r}).read())\n"
    )
    tool.chmod(0o755)
    return tmp


def run_worker(name: str, steps: int, bindir: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIOS_", "NEURON_", "PJRT_"))}
    env.update(
        PJRT_DEVICE="CPU",
        AIOS_TEST_DMI_PRODUCT="/nonexistent",
        PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}",
    )
    if name in ("aios-neuron", "interleaved"):
        env["AIOS_TEST_NEURON_ON_XLA_CPU"] = "1"
    p = subprocess.run(
        [sys.executable, __file__, "--worker", name, "--steps", str(steps)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------ planning


def planning(repeats: int, n: int = 200) -> dict:
    from aios.config.schema import resolve
    from aios.launcher.plan import elastic_plan
    from aios.types import Host, LaunchRequest
    from aios_backend_neuron.launch import build_plan

    hosts = [Host("10.0.0.1", "172.31.0.1", 0), Host("10.0.0.2", "172.31.0.2", 1)]
    req = LaunchRequest("train.py", ["--steps", "10"], hosts=hosts, accelerator="trn2.48xlarge")
    cfg = resolve(
        overrides=["backend=neuron", "neuron.model_type=transformer"],
        environ={},
        check_backend=False,
    )
    base, ours = [], []
    for r in range(repeats * 2):
        for which in ("base", "ours") if r % 2 == 0 else ("ours", "base"):
            t = time.perf_counter()
            for _ in range(n):
                if which == "base":
                    elastic_plan("neuron", cfg, req, 64, env={"PJRT_DEVICE": "NEURON"})
                else:
                    build_plan(cfg, req)
            (base if which == "base" else ours).append((time.perf_counter() - t) / n * 1000)
    code = (
        "import time; t=time.perf_counter(); import aios_backend_neuron.plugin; "
        "print((time.perf_counter()-t)*1000)"
    )
    imp = [
        float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout)
        for _ in range(repeats)
    ]
    code0 = (
        "import time; t=time.perf_counter(); import aios.plugins.hookspecs, aios.types; "
        "print((time.perf_counter()-t)*1000)"
    )
    imp0 = [
        float(subprocess.run([sys.executable, "-c", code0], capture_output=True, text=True).stdout)
        for _ in range(repeats)
    ]
    return {
        "plan_ms": statistics.median(ours),
        "elastic_plan_ms": statistics.median(base),
        "plugin_import_ms": statistics.median(imp),
        "core_types_import_ms": statistics.median(imp0),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--worker", choices=["hand", "aios-xla", "aios-neuron", "interleaved"])
    ap.add_argument(
        "--skip-steps", action="store_true", help="only the planning part (no torch_xla needed)"
    )
    ap.add_argument(
        "--skip-fresh",
        action="store_true",
        help="skip the fresh-process runs (compile counts, loss)",
    )
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker, a.steps)))
        return 0
    checks: dict[str, bool] = {}
    result: dict = {}
    if not a.skip_steps:
        with tempfile.TemporaryDirectory() as bindir:
            _fake_neuron_ls(bindir)
            inter = run_worker("interleaved", a.steps, bindir)
            if "error" in inter:
                print(f"error: {inter['error']}")
                return 1
            ratio = inter["aios"] / inter["hand"]
            print(
                f"XLA:CPU standing in for NeuronCores, one process, {inter['blocks']} "
                "alternating blocks of 10 steps each: "
                f"hand {inter['hand']:.2f} ms/step, aios-neuron ({inter['strategy']}) "
                f"{inter['aios']:.2f} ms/step, ratio {ratio:.3f}"
            )
            checks["aios-neuron step time <= 1.03x hand (same process, interleaved)"] = (
                ratio <= 1.03
            )
            result["interleaved"] = {**inter, "ratio": ratio}
            if not a.skip_fresh:
                names = ["hand", "aios-xla", "aios-neuron"]
                runs: dict[str, list[dict]] = {n: [] for n in names}
                for r in range(a.repeats):
                    for n in names if r % 2 == 0 else list(reversed(names)):
                        res = run_worker(n, a.steps, bindir)
                        runs[n].append(res)
                        print(
                            f"  run {r + 1}/{a.repeats} {n:12s} "
                            + (
                                res.get("error")
                                or f"step {res['step_ms']:.2f} ms, compiles {res['compiles']} "
                                f"(after warm-up {res['compiles_after_warmup']}), loss "
                                f"{res['final_loss']:.4f}"
                            ),
                            flush=True,
                        )
                summary = {}
                for n, rs in runs.items():
                    ok = [x for x in rs if "error" not in x]
                    if not ok:
                        summary[n] = {"error": rs[0]["error"]}
                        continue
                    summary[n] = {
                        "step_ms_median": statistics.median(x["step_ms"] for x in ok),
                        "compiles": sorted({x["compiles"] for x in ok}),
                        "compiles_after_warmup": max(x["compiles_after_warmup"] for x in ok),
                        "final_loss": ok[0]["final_loss"],
                    }
                hand, ours = summary["hand"], summary["aios-neuron"]
                if "error" in ours or "error" in hand:
                    print(f"error: {ours.get('error') or hand.get('error')}")
                    return 1
                checks.update(
                    {
                        "aios-neuron same uncached compilations as hand": ours["compiles"]
                        == hand["compiles"],
                        "aios-neuron zero recompiles after warm-up": ours["compiles_after_warmup"]
                        == 0,
                        "aios-neuron same final loss as hand (1e-4)": abs(
                            ours["final_loss"] - hand["final_loss"]
                        )
                        <= 1e-4 * max(1.0, abs(hand["final_loss"])),
                    }
                )
                print(
                    f"\nfresh processes, {a.steps} steps, medians of {a.repeats} (wall time: noisy on a shared machine)"
                )
                print(
                    f"{'':14s}{'step ms':>10s}{'ratio':>8s}{'compiles':>10s}{'after warm-up':>15s}{'final loss':>12s}"
                )
                for n, sm in summary.items():
                    if "error" in sm:
                        print(f"{n:14s} error: {sm['error']}")
                        continue
                    print(
                        f"{n:14s}{sm['step_ms_median']:10.2f}{sm['step_ms_median'] / hand['step_ms_median']:8.3f}"
                        f"{','.join(map(str, sm['compiles'])):>10s}"
                        f"{sm['compiles_after_warmup']:15d}{sm['final_loss']:12.4f}"
                    )
                result["fresh"] = summary
    plan = planning(a.repeats)
    print(
        f"\nplanning trn2.48xlarge x 2 (128 workers): neuron plan {plan['plan_ms']:.3f} ms vs core elastic_plan "
        f"{plan['elastic_plan_ms']:.3f} ms (ratio {plan['plan_ms'] / plan['elastic_plan_ms']:.2f}x); "
        f"plugin import {plan['plugin_import_ms']:.1f} ms vs aios.plugins.hookspecs+types "
        f"{plan['core_types_import_ms']:.1f} ms"
    )
    checks["plan built in under 5 ms"] = plan["plan_ms"] < 5.0
    result["planning"] = plan
    for k, v in checks.items():
        print(f"{'PASS' if v else 'FAIL'}  {k}")
    if a.json:
        Path(a.json).write_text(json.dumps({**result, "checks": checks}, indent=2))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
