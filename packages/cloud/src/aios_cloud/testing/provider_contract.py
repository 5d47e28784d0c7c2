"""A contract kit for cloud providers: subclass :class:`ProviderContract` in a test module to
prove a :class:`~aios_cloud.provider.CloudProvider` (first-party or third-party) against its
stand-in, with the arguments the CLI passes.

    from aios_cloud.testing.provider_contract import ProviderContract

    class TestMyCloud(ProviderContract):
        cloud = "mine"                                # the registered --cloud name
        accelerators = {"gpu": "g8", "cpu": "c4"}     # one per accelerator kind it offers

        @pytest.fixture
        def provider(self, my_stand_in):              # the provider, reaching the stand-in
            return MyProvider(config_for(my_stand_in))

        @pytest.fixture
        def cli_env(self, my_stand_in, tmp_path):     # the environment of an `aios` subprocess
            return {**os.environ, "AIOS_HOME": str(tmp_path / "home"), ...}

What it checks:

* the features of ``aios launch`` it supports are declared (:mod:`aios_cloud.features`), and
  every other one is refused by the one check in the one shape;
* every capability the commands read is declared with its type (``scheduler``, ``user_hosts``,
  ``shared_paths``, ``default_accelerator``, ``default_ssh_user``), and every hook the provider
  overrides still takes the arguments the interface declares (a drifted signature fails here);
* each hook called as the CLI calls it, for each accelerator kind: ``entry``, ``zones``,
  ``backend_for``, ``python(accelerator, backend)``, ``setup_commands(accelerator,
  requirements, backend)`` (and its refusal of an ``aios*`` requirement from the registry),
  ``host_checks``, ``stop_refusal``/``can_stop``, ``classify_error``, ``launch_extra``;
* ``aios launch --dry-run`` for each accelerator kind: exit 0, nothing written, no forwarded
  secret printed;
* ``aios launch`` with an accelerator the cloud does not offer: one line, exit 2, no traceback;
* the lifecycle against the stand-in: create, describe, list, stop/start where the capacity can
  stop, delete (twice: idempotent); a batch scheduler or the user's own hosts (whose clusters
  live in the aios store): ``aios launch --detach``, ``aios status``, ``aios stop``, ``aios
  down`` through the CLI.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
from aios.errors import AiosError

from aios_cloud.features import FEATURES, CloudFeature, check_features
from aios_cloud.provider.base import CloudProvider, Provider
from aios_cloud.provider.data import CatalogEntry, ClusterRequest
from aios_cloud.provider.errors import CapacityError, CloudError, NotOfferedError, QuotaError
from aios_cloud.provider.scheduler import SchedulerProvider
from aios_cloud.provider.states import STOPPED
from aios_cloud.request import LaunchRequest

SECRET_NAME = "KIT_API_TOKEN"  # not AIOS_*: those are config keys
SECRET_VALUE = "kit-secret-value-4f1c"
TRAIN = "import os\nprint('kit rank', os.environ.get('RANK', '0'), flush=True)\n"

#: ``aios launch`` options that ask for each feature of :data:`aios_cloud.features.FEATURES`
#: (by name) and pass the cloud-free checks of :meth:`LaunchRequest.check` (``requirements``
#: names a file the caller writes in its working directory)
FEATURE_OPTIONS: dict[str, dict[str, Any]] = {
    "spot": {"spot": True},
    "queued": {"queued": True},
    "reservation": {"reservation": "cr-0123456789abcdef0"},
    "image": {"image": "some-image"},
    "disk": {"disk_gb": 100},
    "project": {"project": "some-project"},
    "region": {"region": "some-region"},
    "zone": {"zone": "some-zone"},
    "ssh-login": {"ssh_user": "someone"},
    "setup": {"requirements": "requirements.txt"},
    "host-list": {"hosts": "someone@somehost"},
    "autostop": {"autostop": 10.0},
    "cost-limit": {"max_cost": "50"},
    "labels": {"label": ("team=ml",)},
    "controller": {"controller": "someone@controller", "down_after": True},
}


def expected_refusal(provider: Provider, feature: CloudFeature, flag: str) -> str:
    """The one line every provider gives for ``flag`` of a feature it does not declare."""
    hint = provider.feature_hints.get(feature)
    return f"{flag} is not supported by --cloud {provider.name} ({feature.what}); drop {flag}" + (
        f"; {hint}" if hint else ""
    )


# hooks the commands call on every provider, with the parameters the interface declares
PROVIDER_HOOKS = (
    "catalog",
    "entry",
    "zones",
    "zone_region",
    "reservation_prices",
    "describe",
    "list",
    "start",
    "stop",
    "delete",
    "hosts",
    "backend_for",
    "python",
    "agent_settings",
    "controller_settings",
    "stop_refusal",
    "can_stop",
    "render",
    "describe_credentials",
)
# what the launch and the host commands call on a cloud that provisions hosts
CLOUD_HOOKS = (
    "validate",
    "prepare",
    "create",
    "setup_commands",
    "remote_env",
    "host_checks",
    "prepare_autostop",
    "grant_autostop",
    "check_storage",
    "classify_error",
    "repair",
    "returned_hosts",
    "launch_extra",
    "render_create",
    "render_launch",
)
# what the commands call on a batch scheduler
SCHEDULER_HOOKS = ("launch_job", "job_logs", "cancel")
HOOKS = PROVIDER_HOOKS + CLOUD_HOOKS


def run_aios(
    env: dict[str, str], *args: str, cwd: str | Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """The real ``aios`` CLI in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "aios.cli.main", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout,
        cwd=cwd,
    )


class ProviderContract:
    """Subclass it and provide the ``provider`` and ``cli_env`` fixtures (see the module)."""

    #: the ``--cloud`` name
    cloud: ClassVar[str] = ""
    #: one accelerator per kind the provider offers (``{"tpu": "v5litepod-8"}``)
    accelerators: ClassVar[dict[str, str]] = {}
    #: the accelerator the lifecycle test creates (default: the first of :attr:`accelerators`)
    lifecycle_accelerator: ClassVar[str | None] = None
    #: ``aios launch`` options every launch of this cloud needs (``--hosts ...`` for ssh)
    launch_args: ClassVar[list[str]] = []

    # ------------------------------------------------------------------ what a subclass gives
    @pytest.fixture
    def provider(self) -> Provider:
        raise NotImplementedError("provide a `provider` fixture built against your stand-in")

    @pytest.fixture
    def cli_env(self, tmp_path: Path) -> dict[str, str]:
        raise NotImplementedError("provide a `cli_env` fixture pointing `aios` at your stand-in")

    def cluster_request(self, provider: CloudProvider, name: str) -> ClusterRequest:
        """The request the lifecycle test creates (validated by the provider)."""
        return provider.validate(
            ClusterRequest(
                name=name,
                accelerator=self.lifecycle_accelerator or self._accelerators()[0],
                labels={"aios-cluster": name},
            )
        )

    def launch_request(self, accelerator: str, **options: Any) -> LaunchRequest:
        """The launch request the CLI would build for ``accelerator`` (checked by
        :meth:`LaunchRequest.check` in the CLI; here only its values matter)."""
        return LaunchRequest("train.py", cloud=self.cloud, accelerator=accelerator, **options)

    @pytest.fixture
    def project(self, tmp_path: Path) -> Path:
        work = tmp_path / "kit-project"
        work.mkdir()
        (work / "train.py").write_text(TRAIN)
        return work

    def aios(self, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
        """``aios ARGS`` with ``env`` as its environment: :func:`run_aios`, a subprocess. A kit
        whose stand-in serves from the test process may run the CLI there instead."""
        return run_aios(env, *args)

    def _accelerators(self) -> list[str]:
        assert self.accelerators, f"{type(self).__name__}.accelerators names none"
        return list(self.accelerators.values())

    # ------------------------------------------------------------------ declared capabilities
    def test_capabilities_are_declared_with_their_types(self, provider: Provider) -> None:
        assert isinstance(provider, Provider)
        assert provider.name == self.cloud
        for attr in ("scheduler", "user_hosts", "shared_paths"):
            assert isinstance(getattr(provider, attr), bool), attr
        assert provider.default_accelerator is None or isinstance(provider.default_accelerator, str)
        assert isinstance(provider.default_ssh_user, str)
        assert isinstance(provider.storage_scheme, str) and isinstance(provider.cli, str)
        assert provider.scheduler == isinstance(provider, SchedulerProvider), (
            "a batch scheduler is a SchedulerProvider (and only one is)"
        )
        assert isinstance(provider, CloudProvider) != isinstance(provider, SchedulerProvider), (
            "a provider provisions hosts (CloudProvider) or submits jobs (SchedulerProvider)"
        )

    def test_overridden_hooks_keep_the_interface_signature(self, provider: Provider) -> None:
        """An override that dropped or renamed a parameter the CLI passes fails here (the ssh
        cloud's ``python(accelerator)`` once broke every launch without ``--python``)."""
        scheduler = isinstance(provider, SchedulerProvider)
        base: type[Provider] = SchedulerProvider if scheduler else CloudProvider
        drifted = []
        for hook in PROVIDER_HOOKS + (SCHEDULER_HOOKS if scheduler else CLOUD_HOOKS):
            want = inspect.signature(getattr(base, hook))
            have = inspect.signature(getattr(type(provider), hook))
            params = have.parameters
            if any(p.kind is p.VAR_KEYWORD for p in params.values()):
                continue
            missing = [n for n in want.parameters if n not in params]
            extra = [
                n
                for n, p in params.items()
                if n not in want.parameters
                and p.default is p.empty
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            ]
            if missing or extra:
                drifted.append(f"{hook}{have} (the interface: {hook}{want})")
        assert not drifted, "; ".join(drifted)

    def test_features_are_declared_and_the_rest_refused_in_one_shape(
        self, provider: Provider
    ) -> None:
        """What of ``aios launch`` the cloud supports is a declared set of
        :class:`~aios_cloud.features.CloudFeature`; every other feature is refused by the one
        check, in the one shape, naming the option, the cloud and what to do."""
        assert isinstance(provider.features, frozenset)
        assert all(isinstance(f, CloudFeature) for f in provider.features)
        assert set(provider.feature_hints) <= set(FEATURES) - provider.features, (
            "a hint for a feature the cloud supports is never shown"
        )
        for feature in FEATURES:
            options = FEATURE_OPTIONS[feature.name]
            request = LaunchRequest("train.py", cloud=self.cloud, **options)
            if feature in provider.features:
                check_features(provider.name, provider.features, request, provider.feature_hints)
                continue
            with pytest.raises(AiosError) as err:
                check_features(provider.name, provider.features, request, provider.feature_hints)
            flag = "--" + next(iter(options)).replace("_", "-")
            assert err.value.one_line() == expected_refusal(provider, feature, flag)

    # ------------------------------------------------------------------ hooks, as the CLI calls
    def test_hooks_answer_the_arguments_the_cli_passes(self, provider: Provider) -> None:
        if isinstance(provider, SchedulerProvider):
            # the commands hand a scheduler the launch request (launch_job); they read its
            # catalog (`aios catalog`, `aios cost`) and classify nothing else
            entries = provider.catalog()
            assert entries and all(isinstance(e, CatalogEntry) for e in entries)
            for e in entries:
                assert provider.entry(e.accelerator).accelerator == e.accelerator
            assert provider.stop_refusal(False) is None or isinstance(
                provider.stop_refusal(False), str
            )
            return
        assert isinstance(provider, CloudProvider)
        for kind, acc in self.accelerators.items():
            entry = provider.entry(acc)
            assert isinstance(entry, CatalogEntry) and entry.accelerator, kind
            assert isinstance(provider.zones(acc), list), kind
            backend = provider.backend_for(acc)
            assert isinstance(backend, str) and backend, kind
            for b in (backend, None):
                assert isinstance(provider.python(acc, b), str) and provider.python(acc, b)
                lines = provider.setup_commands(acc, ["requests==2.31.0"], b)
                assert isinstance(lines, list) and all(isinstance(x, str) for x in lines), kind
            with pytest.raises(CloudError, match="registry"):
                provider.setup_commands(acc, ["aios-core"], backend)
            checks = provider.host_checks(acc, 1)
            assert isinstance(checks, list) and all(isinstance(x, str) for x in checks), kind
            for spot in (False, True):
                why = provider.stop_refusal(spot, acc)
                assert why is None or (isinstance(why, str) and "\n" not in why), kind
                assert provider.can_stop(spot, acc) == (why is None), kind
        assert provider.classify_error(CapacityError("no capacity", "")) == "stockout"
        assert provider.classify_error(QuotaError("over quota", "")) == "quota"
        assert provider.classify_error(NotOfferedError("not here", "")) == "unavailable"
        assert isinstance(provider.agent_settings(), dict)
        assert isinstance(provider.controller_settings(), dict)
        if not provider.scheduler:
            acc = self._accelerators()[0]
            extra = provider.launch_extra(self.launch_request(acc, **self.launch_options()), False)
            assert isinstance(extra, dict)
            assert SECRET_VALUE not in repr(extra)

    def launch_options(self) -> dict[str, Any]:
        """The :class:`LaunchRequest` options :attr:`launch_args` stand for (``hosts=...``)."""
        return {}

    def test_describe_credentials_names_the_source_never_the_secret(
        self, provider: Provider
    ) -> None:
        where = provider.describe_credentials()
        assert isinstance(where, str) and SECRET_VALUE not in where

    # ------------------------------------------------------------------ dry run
    def test_dry_run_for_each_accelerator_kind(
        self, cli_env: dict[str, str], project: Path, tmp_path: Path
    ) -> None:
        env = {**cli_env, SECRET_NAME: SECRET_VALUE}
        home = Path(env["AIOS_HOME"])
        existed = home.exists()
        for kind, acc in self.accelerators.items():
            r = self.aios(
                env,
                "launch",
                "--cloud",
                self.cloud,
                "-a",
                acc,
                *self.launch_args,
                "--env",
                SECRET_NAME,
                "--workdir",
                str(project),
                "--dry-run",
                "train.py",
            )
            assert r.returncode == 0, f"{kind} ({acc}): {r.stderr[-2000:]}"
            assert "dry run" in r.stdout, f"{kind} ({acc}) printed no plan: {r.stdout[:500]}"
            assert SECRET_VALUE not in r.stdout + r.stderr, f"{kind}: the secret was printed"
            assert "Traceback" not in r.stderr
        if not existed:
            assert not (home / "state.db").exists(), "a dry run wrote the aios state"

    # ------------------------------------------------------------------ errors
    def test_an_accelerator_it_does_not_offer_is_one_line(
        self, cli_env: dict[str, str], project: Path
    ) -> None:
        r = self.aios(
            cli_env,
            "launch",
            "--cloud",
            self.cloud,
            "-a",
            "no-such-accelerator-9",
            *self.launch_args,
            "--workdir",
            str(project),
            "--dry-run",
            "train.py",
        )
        assert r.returncode == 2, r.stdout[-1000:] + r.stderr[-1000:]
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("aios: error:"), r.stderr
        assert "Traceback" not in r.stderr

    # ------------------------------------------------------------------ lifecycle
    def test_lifecycle_against_the_stand_in(
        self, provider: Provider, cli_env: dict[str, str], project: Path
    ) -> None:
        if isinstance(provider, SchedulerProvider) or provider.user_hosts:
            # the cluster lives in the aios store (a scheduler's job, the user's own hosts):
            # through the commands, as the user runs them
            self._cli_lifecycle(provider, cli_env, project)
            return
        assert isinstance(provider, CloudProvider)
        name = "kit-life"
        request = self.cluster_request(provider, name)
        try:
            info = provider.create(request)
            assert info.ready, info.state
            seen = provider.describe(name, info.zone)
            assert seen is not None and seen.ready and seen.name == name
            assert name in [c.name for c in provider.list()]
            assert provider.hosts(seen), "a READY cluster has hosts to reach"
            if provider.can_stop(request.spot, request.accelerator):
                provider.stop(name, info.zone)
                stopped = provider.describe(name, info.zone)
                assert stopped is not None
                if not provider.user_hosts:  # aios never stops hosts it did not create
                    assert stopped.state == STOPPED, stopped.state
                assert provider.start(name, info.zone).ready
        finally:
            provider.delete(name, request.zone)
        gone = provider.describe(name, request.zone)
        assert gone is None or gone.state in ("TERMINATED", "DELETING"), gone
        provider.delete(name, request.zone)  # idempotent

    def _cli_lifecycle(self, provider: Provider, env: dict[str, str], project: Path) -> None:
        acc = self.lifecycle_accelerator or self._accelerators()[0]
        name = "kit-life"
        r = self.aios(
            env,
            "launch",
            "--cloud",
            self.cloud,
            "-a",
            acc,
            *self.launch_args,
            "--name",
            name,
            "--detach",
            "--workdir",
            str(project),
            "train.py",
        )
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        try:
            r = self.aios(env, "status", name, "--refresh", "--json")
            assert r.returncode == 0, r.stderr[-2000:]
            assert name in r.stdout
            if provider.can_stop(False, acc):
                r = self.aios(env, "stop", name)
                assert r.returncode == 0, r.stderr[-2000:]
        finally:
            r = self.aios(env, "down", name)
            assert r.returncode == 0, r.stderr[-2000:]
        r = self.aios(env, "status", "--json")
        assert r.returncode == 0 and f'"{name}"' not in r.stdout, r.stdout[-2000:]


__all__ = ["ProviderContract", "run_aios", "SECRET_NAME", "SECRET_VALUE"]
