"""The CloudProvider interface: providers import without warnings (no adapter for older hook
signatures remains: a drifted override is caught by the provider contract kit), the launch
request is checked once with one-line errors, and a scheduler is a scheduler provider."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from aios_cloud.provider.base import CloudProvider, Provider
from aios_cloud.provider.scheduler import SchedulerProvider
from aios_cloud.request import LaunchRequest


def test_first_party_providers_import_without_warnings() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        import aios_cloud.sshhosts.provider  # noqa: F401
        import aios_cloud_aws.provider  # noqa: F401
        import aios_cloud_gcp.provider  # noqa: F401
        import aios_cloud_k8s.provider  # noqa: F401
        import aios_cloud_slurm.provider  # noqa: F401


def test_the_old_adapters_are_gone() -> None:
    import aios_cloud.provider as provider

    assert not hasattr(provider, "_OLD_FORMS") and not hasattr(provider, "_adapt")
    assert "__init_subclass__" not in vars(provider.CloudProvider)


def test_launch_request_is_checked_once_with_one_line_errors(tmp_path: Any) -> None:
    from aios.errors import AiosError

    (tmp_path / "train.py").write_text("")
    ok = LaunchRequest.from_options(
        {"script": "train.py", "script_args": ("--", "--epochs", "3"), "workdir": str(tmp_path)}
    )
    assert ok.args == ["--epochs", "3"]
    for options, msg in (
        ({"nodes": 0}, "--nodes must be at least 1"),
        ({"autodown": True}, "--autodown needs --autostop"),
        ({"valid_after": "+2h"}, "only apply to queued resources"),
        ({"controller": "host:x", "down_after": True}, "is not USER@HOST"),
        ({"env_items": ("1BAD",)}, "is not NAME=VALUE"),
        ({"script": "missing.py"}, "script missing.py not found"),
    ):
        with pytest.raises(AiosError, match=msg):
            LaunchRequest.from_options({"script": "train.py", "workdir": str(tmp_path), **options})
    with pytest.raises(TypeError, match="no option bogus"):
        LaunchRequest.from_options({"script": "train.py", "bogus": 1})


def test_a_scheduler_is_a_scheduler_provider() -> None:
    from aios_cloud_k8s.provider import K8sProvider
    from aios_cloud_slurm.provider import SlurmProvider

    for cls in (SlurmProvider, K8sProvider):
        assert issubclass(cls, SchedulerProvider) and cls.scheduler
        # a base of its own: nothing to create, no create to refuse
        assert issubclass(cls, Provider) and not issubclass(cls, CloudProvider)
        assert "create" not in dir(cls) and "render_create" not in dir(cls)
