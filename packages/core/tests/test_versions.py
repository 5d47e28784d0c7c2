"""Version sets (aios.plugins.versions): specifiers, matching, one-line mismatches, the per-host check."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version

import pytest
from aios.errors import ConfigError
from aios.plugins import versions as V


@pytest.mark.parametrize(
    ("v", "spec", "ok"),
    [
        ("2.13.0+cpu", ">=2.11,<=2.15", True),
        ("2.15.0", ">=2.11,<=2.15", True),
        ("2.15.1", ">=2.11,<=2.15", False),
        ("2.10.0", ">=2.11,<=2.15", False),
        ("0.0.52", ">=0.0.50", True),
        ("0.0.21", ">=0.0.50", False),
        ("0.2.0", "==0.2.*", True),
        ("0.3.0", "==0.2.*", False),
        ("2.9.0.2.29.1234", "==2.9.0.2.29.*", True),
        ("2.9.0.2.28.1", "==2.9.0.2.29.*", False),
        ("2.14.3.0", "==2.14.*", True),
        ("2.0rc1", ">=2.0", True),
    ],
)
def test_satisfies(v: str, spec: str, ok: bool) -> None:
    assert V.satisfies(v, spec) is ok


def test_bad_specifier_is_an_error() -> None:
    with pytest.raises(ValueError, match="bad version specifier"):
        V.satisfies("1.0", "about 1")


def test_torch_tpu_set_matches_the_wheel_metadata_ranges() -> None:
    vs = V.sets_for("torch_tpu")[0]
    assert vs.spec_of("torch") == ">=2.11,<=2.15"
    assert vs.spec_of("libtpu") == ">=0.0.50"


def test_good_torch_tpu_host_passes() -> None:
    res = V.check(
        "torch_tpu",
        host="w0",
        versions={"torch_tpu": "0.2.0", "torch": "2.13.0", "libtpu": "0.0.52", "numpy": "2.4.1"},
    )
    assert res.ok and res.matched is not None and res.matched.name == "TorchTPU 0.2"
    assert (
        res.line() == "w0: TorchTPU 0.2 (torch_tpu 0.2.0, torch 2.13.0, libtpu 0.0.52, numpy 2.4.1)"
    )


def test_torch_outside_torch_tpu_range_is_one_line_with_host_installed_and_expected() -> None:
    with pytest.raises(V.VersionMismatch) as ei:
        V.require(
            "torch_tpu",
            host="tpu-worker-3",
            versions={"torch_tpu": "0.2.0", "torch": "2.9.0", "libtpu": "0.0.52", "numpy": "2.1.0"},
        )
    line = ei.value.one_line()
    assert "\n" not in line
    assert line.startswith(
        "tpu-worker-3: torch 2.9.0 is installed, TorchTPU 0.2 needs torch>=2.11,<=2.15"
    )
    assert "expected TorchTPU 0.2" in line and "pip install torch==2.13.0 torch_tpu==0.2.0" in line
    assert ei.value.exit_code == 2


def test_libtpu_missing_is_named() -> None:
    res = V.check(
        "torch_tpu",
        host="h",
        versions={"torch_tpu": "0.2.0", "torch": "2.13.0", "libtpu": None, "numpy": "2.0"},
    )
    assert not res.ok and res.problems == ["libtpu is not installed (needs >=0.0.50)"]


def test_nothing_installed_names_the_identifying_package() -> None:
    res = V.check(
        "torch_xla", host="h", versions={"torch_xla": None, "torch": "2.13.0", "libtpu": None}
    )
    assert not res.ok
    assert res.problems == ["torch_xla is not installed (needs ==2.9.*)"]


def test_torch_xla_set_picks_the_matching_release() -> None:
    res = V.check(
        "torch_xla", host="h", versions={"torch_xla": "2.8.0", "torch": "2.8.0", "libtpu": "0.0.17"}
    )
    assert res.ok and res.matched is not None and res.matched.name == "PyTorch/XLA 2.8"
    res = V.check(
        "torch_xla", host="h", versions={"torch_xla": "2.9.0", "torch": "2.8.0", "libtpu": "0.0.21"}
    )
    assert not res.ok and res.closest is not None and res.closest.name.startswith("PyTorch/XLA 2.9")
    assert res.problems == [
        "torch 2.8.0 is installed, PyTorch/XLA 2.9 (last release) needs torch==2.9.*"
    ]


def test_neuron_sets_carry_the_dlami_facts() -> None:
    native = V.sets_for("neuron")[0]
    assert native.image["venv"] == "/opt/aws_neuronx_venv_torch_neuronx_2_14_0"
    assert native.hardware == ("trn2", "trn2u", "trn3")
    xla = V.sets_for("neuron-xla")[0]
    assert (
        xla.image["ssm_parameter"]
        == "/aws/service/neuron/dlami/pytorch-2.9/ubuntu-24.04/latest/image_id"
    )
    assert "2.29" in xla.name and "trn1" in xla.hardware


def test_cuda_build_is_read_from_the_torch_local_tag() -> None:
    res = V.check(
        "cuda",
        host="g",
        versions={"torch": "2.9.1+cu128", "nvidia-driver": "550.54"},
        lookup=lambda d: V.installed(d) if d != "cuda-build" else "12.8",
    )
    assert not res.ok and res.problems == [
        "nvidia-driver 550.54 is installed, torch cu128 needs nvidia-driver>=570.26"
    ]


def test_installed_reads_metadata_without_importing() -> None:
    code = (
        "import sys; from aios.plugins.versions import installed; "
        "print(installed('pytest')); print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == [version("pytest"), "False"]
    assert V.installed("surely-not-a-distribution-aios") is None


def test_unknown_stack() -> None:
    with pytest.raises(ConfigError, match="unknown version stack 'tpu9'"):
        V.sets_for("tpu9")


def test_module_entry_point_exit_2_one_line() -> None:
    env = {**os.environ}
    out = subprocess.run(
        [sys.executable, "-m", "aios.plugins.versions", "torch_tpu", "--host", "hostA"],
        capture_output=True,
        text=True,
        env=env,
    )
    if V.check("torch_tpu").ok:  # the TorchTPU test environment
        assert out.returncode == 0 and out.stdout.startswith("hostA: TorchTPU 0.2 ok")
    else:
        assert out.returncode == 2
        assert len(out.stderr.strip().splitlines()) == 1
        assert out.stderr.startswith("aios: error: hostA: ")
