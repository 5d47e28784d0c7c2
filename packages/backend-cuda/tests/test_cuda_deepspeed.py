"""strategy: deepspeed. The generated DeepSpeed JSON, and real DeepSpeed ZeRO on CPU
(DS_ACCELERATOR=cpu, gloo) through `aios-run` with the unchanged runtime-API script: ZeRO-2 over
2 processes follows the DDP loss curve, a ZeRO checkpoint written by rt.save() resumes exactly,
and ZeRO-3 with CPU optimizer offload trains the same curve."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest
from aios.config.schema import resolve
from aios.errors import ConfigError
from aios.testing.launch import AIOS_RUN
from aios_backend_cuda.deepspeed_strategy import build_ds_config

SCRIPT = Path(__file__).parent / "scripts" / "cuda_ds_train.py"


def _cfg(*overrides: str, **flags):
    return resolve(overrides=list(overrides), flags=flags, environ={}, check_backend=False)


# ------------------------------------------------------------------------------ the JSON


def test_generated_from_aios_config() -> None:
    cfg = _cfg(
        "grad_accum=4",
        "grad_clip=1.0",
        "deepspeed.zero_stage=3",
        "deepspeed.offload_param=cpu",
        "deepspeed.offload_optimizer=nvme",
        "deepspeed.nvme_path=/local_nvme",
        precision="bf16-mixed",
    )
    ds = build_ds_config(cfg, world_size=16, micro_batch_size=8)
    assert ds["train_micro_batch_size_per_gpu"] == 8 and ds["gradient_accumulation_steps"] == 4
    assert ds["train_batch_size"] == 8 * 4 * 16
    assert ds["gradient_clipping"] == 1.0
    assert ds["bf16"] == {"enabled": True} and "fp16" not in ds
    z = ds["zero_optimization"]
    assert z["stage"] == 3 and z["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert (
        z["offload_optimizer"]["device"] == "nvme"
        and z["offload_optimizer"]["nvme_path"] == "/local_nvme"
    )
    assert z["stage3_gather_16bit_weights_on_model_save"] is True


def test_fp16_dynamic_loss_scale_and_defaults() -> None:
    ds = build_ds_config(_cfg(precision="fp16-mixed"), world_size=1)
    assert ds["fp16"]["enabled"] and ds["fp16"]["loss_scale"] == 0
    assert ds["train_micro_batch_size_per_gpu"] == 1 and ds["gradient_clipping"] == 0.0
    assert (
        ds["zero_optimization"]["stage"] == 2 and "offload_optimizer" not in ds["zero_optimization"]
    )


def test_user_json_overrides_and_auto(tmp_path: Path) -> None:
    user = tmp_path / "ds.json"
    user.write_text(
        json.dumps(
            {
                "train_micro_batch_size_per_gpu": "auto",
                "gradient_clipping": 0.5,
                "zero_optimization": {
                    "stage": 1,
                    "reduce_bucket_size": "auto",
                    "round_robin_gradients": True,
                },
                "activation_checkpointing": {"partition_activations": True},
            }
        )
    )
    ds = build_ds_config(
        _cfg(f"deepspeed.config={user}", "grad_clip=1.0"), world_size=2, micro_batch_size=4
    )
    assert ds["train_micro_batch_size_per_gpu"] == 4 and ds["train_batch_size"] == 8
    assert ds["gradient_clipping"] == 0.5
    assert (
        ds["zero_optimization"]["stage"] == 1
        and ds["zero_optimization"]["round_robin_gradients"] is True
    )
    assert ds["zero_optimization"]["reduce_bucket_size"] == 500_000_000
    assert ds["activation_checkpointing"] == {"partition_activations": True}


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (["deepspeed.offload_param=cpu"], "needs ZeRO stage 3"),
        (["deepspeed.zero_stage=0", "deepspeed.offload_optimizer=cpu"], "stage 1, 2 or 3"),
        (["deepspeed.offload_optimizer=nvme"], "deepspeed.nvme_path"),
        (["deepspeed.config=/nonexistent/ds.json"], "does not exist"),
    ],
)
def test_bad_settings_are_one_line_errors(overrides: list[str], words: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_ds_config(_cfg(*overrides), world_size=1)
    assert words in err.value.one_line() and "\n" not in err.value.one_line()


def test_user_json_accumulation_must_agree(tmp_path: Path) -> None:
    user = tmp_path / "ds.json"
    user.write_text('{"gradient_accumulation_steps": 8}')
    with pytest.raises(ConfigError) as err:
        build_ds_config(_cfg(f"deepspeed.config={user}", "grad_accum=2"), world_size=1)
    assert "grad_accum=8" in err.value.fix
    user.write_text("{not json")
    with pytest.raises(ConfigError):
        build_ds_config(_cfg(f"deepspeed.config={user}"), world_size=1)


def test_unknown_deepspeed_key_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as err:
        _cfg("deepspeed.zero=2")
    assert "deepspeed.zero" in err.value.message and "zero_stage" in err.value.fix


# ------------------------------------------------------------------------------ real DeepSpeed on CPU

needs_ds = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None,
    reason="deepspeed is not installed (pip install -e ./packages/core "
    "'./packages/backend-cuda[test]' from the aios checkout)",
)


from aios.testing import find_free_port as _free_port  # noqa: E402 - what the free_port fixture returns


def _run(tmp: Path, out: str, *overrides: str, stop_after: int = 0, nprocs: int = 2) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIOS_", "DS_"))}
    env.update(
        {
            "AIOS_LOGGING__RUN_DIR": str(tmp / "runs"),
            "AIOS_LOGGING__TENSORBOARD": "false",
            "OMP_NUM_THREADS": "1",
            "TOTAL_STEPS": "10",
            "STOP_AFTER": str(stop_after),
        }
    )
    for _attempt in range(3):  # another process on this machine may take the free port first
        cmd = [
            *AIOS_RUN,
            "--backend",
            "cpu",
            "--nprocs",
            str(nprocs),
            "--master-port",
            str(_free_port()),
            "grad_accum=2",
            "grad_clip=1.0",
            *overrides,
            str(SCRIPT),
            str(tmp / out),
        ]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp)
        if proc.returncode == 0 or "EADDRINUSE" not in proc.stdout + proc.stderr:
            break
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((tmp / out).read_text())


@pytest.fixture(scope="module")
def ddp_curve(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("ddp")
    res = _run(tmp, "ddp.json")
    assert res["strategy"] == "DDPStrategy"
    return res


@pytest.fixture(scope="module")
def zero2_curve(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One uninterrupted ZeRO-2 run of 10 steps: the curve that follows DDP's, and the one a
    checkpointed ZeRO-2 run resumes to bit for bit (one run read by both tests)."""
    tmp = tmp_path_factory.mktemp("zero2")
    return _run(tmp, "zero2.json", "strategy=deepspeed", "deepspeed.zero_stage=2")


def _close(a: dict, b: dict, rtol: float = 1e-4) -> None:
    assert a["losses"].keys() == b["losses"].keys()
    for k in a["losses"]:
        assert a["losses"][k] == pytest.approx(b["losses"][k], rel=rtol), k
    assert a["checksum"] == pytest.approx(b["checksum"], rel=rtol)


@needs_ds
def test_zero2_two_ranks_follows_ddp(ddp_curve: dict, zero2_curve: dict) -> None:
    ds = zero2_curve
    assert ds["strategy"] == "DeepSpeedStrategy"
    m = ds["metrics"]
    assert m["zero_stage"] == 2 and m["world_size"] == 2 and m["global_steps"] == 10
    assert m["train_batch_size"] == 8 * 2 * 2  # loader batch x grad_accum x ranks
    assert ds["lr"] == pytest.approx(
        ddp_curve["lr"]
    )  # the script's LR scheduler drove DeepSpeed's optimizer
    first, last = ds["losses"]["1"], ds["losses"]["10"]
    assert last < first  # it trains
    _close(ds, ddp_curve)


@needs_ds
def test_zero2_checkpoint_resumes_exactly(tmp_path: Path, zero2_curve: dict) -> None:
    """Stopped after step 4 with a checkpoint (ZeRO stage left at its default), resumed: the
    rest of the curve is bitwise the uninterrupted explicit ``deepspeed.zero_stage=2`` run's."""
    ckpt = tmp_path / "ckpt"
    first = _run(
        tmp_path, "part1.json", "strategy=deepspeed", f"checkpoint.dir={ckpt}", stop_after=4
    )
    assert first["start"] == 0 and sorted(map(int, first["losses"])) == [1, 2, 3, 4]
    saved = sorted(p.name for p in ckpt.iterdir())
    assert saved == ["ckpt-000000004"]
    marker = json.loads((ckpt / "ckpt-000000004" / "aios-checkpoint.json").read_text())
    assert marker["world_size"] == 2 and "state.pt" in marker["files"]
    rest = _run(tmp_path, "part2.json", "strategy=deepspeed", f"checkpoint.dir={ckpt}")
    assert rest["start"] == 4 and sorted(map(int, rest["losses"])) == list(range(5, 11))
    full = zero2_curve
    for k, v in rest["losses"].items():
        assert v == full["losses"][k]  # bitwise: same shards, same data position, same RNG
    assert rest["checksum"] == full["checksum"] and rest["lr"] == full["lr"]


@needs_ds
def test_zero3_with_cpu_offload_follows_ddp(tmp_path: Path, ddp_curve: dict) -> None:
    ds = _run(
        tmp_path,
        "zero3.json",
        "strategy=deepspeed",
        "deepspeed.zero_stage=3",
        "deepspeed.offload_optimizer=cpu",
    )
    assert ds["metrics"]["zero_stage"] == 3 and ds["metrics"]["offload_optimizer"] == "cpu"
    _close(ds, ddp_curve)
