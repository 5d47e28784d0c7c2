"""What a cloud supports of ``aios launch``'s options, declared, and checked once.

Each provider declares the features it supports as a typed class attribute
(:attr:`aios_cloud.provider.CloudProvider.features`, a ``frozenset`` of :class:`CloudFeature`),
the way a cloud plugin declares anything else about itself. :func:`check_features` compares a
:class:`~aios_cloud.request.LaunchRequest` with that declaration once, before anything else of
the launch runs (dry run included), and refuses an option the cloud does not support with one
line for every provider (exit 2)::

    --spot is not supported by --cloud slurm (spot capacity); drop --spot

A provider may add what to do instead (:attr:`~aios_cloud.provider.CloudProvider.feature_hints`,
e.g. Slurm's ``set slurm.login / slurm.ssh_key instead``): the hint then follows the ``drop``.

A third-party cloud declares its features the same way::

    from aios_cloud.features import LABELS, SETUP, SPOT

    class MyCloud(CloudProvider):
        features = frozenset({SPOT, SETUP, LABELS})
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from aios.errors import AiosError

from aios_cloud.request import HOST_OPTIONS, LaunchRequest

if TYPE_CHECKING:
    from collections.abc import Iterable


@dataclass(frozen=True)
class CloudFeature:
    """One thing a cloud may support, and the ``aios launch`` options that ask for it.

    :param name: the feature's name (``spot``), as ``aios launch --help`` and the docs say it.
    :param options: the :class:`~aios_cloud.request.LaunchRequest` fields that ask for it
        (``("queued", "valid_after", "valid_until")``); each is the flag with ``-`` for ``_``.
    :param what: the feature in words, for the refusal line.
    """

    name: str
    options: tuple[str, ...]
    what: str

    def flags(self) -> list[str]:
        return ["--" + o.replace("_", "-") for o in self.options]

    def given(self, request: LaunchRequest) -> list[str]:
        """The options of this feature ``request`` sets (as flags), in declaration order."""
        defaults = {f.name: f.default for f in fields(LaunchRequest)}
        values = vars(request)
        return [
            "--" + o.replace("_", "-")
            for o in self.options
            if values[o] not in (None, "", ()) and values[o] != defaults[o]
        ]


SPOT = CloudFeature("spot", ("spot",), "spot capacity")
QUEUED = CloudFeature(
    "queued", ("queued", "valid_after", "valid_until"), "queued resources that wait for capacity"
)
RESERVATION = CloudFeature("reservation", ("reservation",), "reserved capacity")
IMAGE = CloudFeature("image", ("image",), "a chosen host image")
DISK = CloudFeature("disk", ("disk_gb",), "a chosen boot disk size")
PROJECT = CloudFeature("project", ("project",), "a project or account")
REGION = CloudFeature("region", ("region",), "regions")
ZONE = CloudFeature("zone", ("zone",), "zones")
SSH_LOGIN = CloudFeature("ssh-login", ("ssh_user", "ssh_key"), "an SSH login of your choosing")
SETUP = CloudFeature(
    "setup", ("requirements", "setup_script"), "setup commands run on the hosts before the job"
)
HOST_LIST = CloudFeature("host-list", HOST_OPTIONS, "a list of hosts you already have")
AUTOSTOP = CloudFeature("autostop", ("autostop", "autodown"), "stopping idle clusters")
COST_LIMIT = CloudFeature("cost-limit", ("max_cost",), "hourly prices to bound the spend with")
LABELS = CloudFeature("labels", ("label",), "labels on the cloud resources")
CONTROLLER = CloudFeature(
    "controller", ("controller", "controller_python"), "a controller host for managed jobs"
)

#: every feature ``aios launch`` knows, in the order the check reports them
FEATURES: tuple[CloudFeature, ...] = (
    SPOT,
    QUEUED,
    RESERVATION,
    IMAGE,
    DISK,
    PROJECT,
    REGION,
    ZONE,
    SSH_LOGIN,
    SETUP,
    HOST_LIST,
    AUTOSTOP,
    COST_LIMIT,
    LABELS,
    CONTROLLER,
)


def refusal(
    feature: CloudFeature, flag: str, cloud: str, hints: Mapping[CloudFeature, str]
) -> AiosError:
    """The one refusal every provider gives for an option it does not support."""
    hint = hints.get(feature)
    return AiosError(
        f"{flag} is not supported by --cloud {cloud} ({feature.what})",
        f"drop {flag}" + (f"; {hint}" if hint else ""),
    )


def check_features(
    cloud: str,
    declared: Iterable[CloudFeature],
    request: LaunchRequest,
    hints: Mapping[CloudFeature, str] | None = None,
) -> None:
    """Refuse the first option of ``request`` whose feature ``cloud`` does not declare."""
    have = frozenset(declared)
    for feature in FEATURES:
        if feature in have:
            continue
        given = feature.given(request)
        if given:
            raise refusal(feature, given[0], cloud, hints or {})


__all__ = [
    "AUTOSTOP",
    "CONTROLLER",
    "COST_LIMIT",
    "DISK",
    "FEATURES",
    "HOST_LIST",
    "IMAGE",
    "LABELS",
    "PROJECT",
    "QUEUED",
    "REGION",
    "RESERVATION",
    "SETUP",
    "SPOT",
    "SSH_LOGIN",
    "ZONE",
    "CloudFeature",
    "check_features",
    "refusal",
]
