"""Declared cloud features: every installed provider, asked through ``aios launch`` for each
feature it does not declare, refuses it in the same one-line shape (the option, the cloud, what
to do), before anything else of the launch runs; what it declares passes the check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from aios.errors import AiosError
from aios.plugins.registry import reset_registry
from aios_cloud.features import FEATURES, check_features
from aios_cloud.launch.flow import run
from aios_cloud.records import get_provider, installed_clouds
from aios_cloud.request import LaunchRequest
from aios_cloud.ssh import LinePrinter
from aios_cloud.testing.provider_contract import FEATURE_OPTIONS, expected_refusal

FIRST_PARTY = {"aws", "gcp", "k8s", "slurm", "ssh"}


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AIOS_HOME", str(tmp_path / "aios-home"))
    for k in [k for k in os.environ if k.startswith("AIOS_") and k != "AIOS_HOME"]:
        monkeypatch.delenv(k)
    reset_registry()
    monkeypatch.chdir(tmp_path)  # FEATURE_OPTIONS' requirements.txt
    (tmp_path / "requirements.txt").write_text("numpy\n")
    (tmp_path / "train.py").write_text("")
    return tmp_path


def test_every_provider_refuses_every_undeclared_feature_in_one_shape(work: Path) -> None:
    clouds = installed_clouds()
    assert FIRST_PARTY <= set(clouds), clouds
    refused = 0
    for cloud in clouds:
        provider = get_provider(cloud, None)
        for feature in FEATURES:
            if feature in provider.features:
                continue
            options = FEATURE_OPTIONS[feature.name]
            request = LaunchRequest.from_options(
                {"script": "train.py", "workdir": str(work), "cloud": cloud, "dry_run": True}
                | options
            )
            flag = "--" + next(iter(options)).replace("_", "-")
            with pytest.raises(AiosError) as err:
                run(request, print, print, LinePrinter())
            assert str(err.value) == expected_refusal(provider, feature, flag), (cloud, feature)
            assert err.value.message.startswith(f"{flag} is not supported by --cloud {cloud} (")
            refused += 1
    # the schedulers and the user's own hosts support little of it: the check really ran
    assert refused >= 30, refused
    assert not (work / "aios-home").exists()  # refused before anything was written


def test_what_a_provider_declares_passes_the_check(work: Path) -> None:
    for cloud in installed_clouds():
        provider = get_provider(cloud, None)
        for feature in provider.features:
            request = LaunchRequest.from_options(
                {"script": "train.py", "workdir": str(work), "cloud": cloud}
                | FEATURE_OPTIONS[feature.name]
            )
            check_features(cloud, provider.features, request, provider.feature_hints)


def test_the_refusal_is_one_line_exit_2_through_the_cli(work: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "aios.cli.main", "launch", "--cloud", "ssh", "--hosts", "a"]
        + ["--autostop", "0", "--workdir", str(work), "--dry-run", "train.py"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [
        "aios: error: --autostop is not supported by --cloud ssh (stopping idle clusters); drop "
        "--autostop; your hosts bill nothing to aios; `aios down NAME` ends aios's processes there"
    ]
