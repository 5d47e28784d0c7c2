"""The CloudProvider interface: a provider written against an older hook signature keeps
working through the one adapter (checked when its class is created, with a DeprecationWarning
naming the new form), and the CLI's calls reach it with the arguments they pass today."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from aios_cloud.provider import CloudProvider, ClusterRequest, LaunchPlan, SchedulerProvider
from aios_cloud.request import JobSpec, LaunchRequest


def _old_style() -> type[CloudProvider]:
    class OldCloud(CloudProvider):
        name = "old"

        def catalog(self) -> Any:
            return []

        def create(self, request: Any) -> Any: ...
        def describe(self, name: str, zone: str | None) -> Any: ...
        def list(self, zone: str | None = None) -> Any:
            return []

        def start(self, name: str, zone: str | None) -> Any: ...
        def stop(self, name: str, zone: str | None) -> None: ...
        def delete(self, name: str, zone: str | None) -> None: ...
        def render_create(self, request: Any) -> Any:
            return []

        def render(self, action: str, name: str, zone: str | None) -> Any:
            return []

        # the forms before `backend` / `accelerator` were passed
        def python(self, accelerator):  # type: ignore[no-untyped-def]
            return f"py-{accelerator}"

        def setup_commands(self, accelerator, requirements):  # type: ignore[no-untyped-def]
            return [f"install {' '.join(requirements)}"]

        def can_stop(self, spot):  # type: ignore[no-untyped-def]
            return not spot

        def launch_dry_run(self, request, spec, config, existing, echo):  # type: ignore[no-untyped-def]
            echo(f"old dry run of {request.name}")

    return OldCloud


def test_old_hook_signatures_are_adapted_once_with_a_warning_naming_the_new_form() -> None:
    with pytest.warns(DeprecationWarning) as seen:
        cls = _old_style()
    said = " ".join(str(w.message) for w in seen)
    for new in (
        "python(self, accelerator, backend=None)",
        "setup_commands(self, accelerator, requirements, backend=None)",
        "can_stop(self, spot, accelerator=None)",
        "render_launch(self, plan: LaunchPlan, echo)",
    ):
        assert new in said, said
    p = cls()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning per call: the adapter was made once
        assert p.python("v5e", "xla") == "py-v5e"
        assert p.python("v5e", backend="cuda") == "py-v5e"
        assert p.setup_commands("a", ["x==1"], "cpu") == ["install x==1"]
        assert p.can_stop(True, "a") is False and p.can_stop(False, accelerator="a") is True
        out: list[str] = []
        p.render_launch(
            LaunchPlan(
                cluster=ClusterRequest("c1", "a"),
                spec=JobSpec("train.py"),
                config=None,
            ),
            out.append,
        )
        assert out == ["old dry run of c1"]


def test_first_party_providers_need_no_adapter() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        import aios_cloud.sshhosts  # noqa: F401
        import aios_cloud_aws.provider  # noqa: F401
        import aios_cloud_gcp.provider  # noqa: F401
        import aios_cloud_k8s.provider  # noqa: F401
        import aios_cloud_slurm.provider  # noqa: F401


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
