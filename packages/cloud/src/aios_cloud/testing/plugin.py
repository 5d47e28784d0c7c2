"""The aios-cloud pytest plugin: real sshd hosts for cloud provider tests.

Registered through the ``pytest11`` entry point of aios-cloud
(``aios-cloud = "aios_cloud.testing.plugin"``); nothing heavy is imported.

Fixtures:

* ``sshd_cluster``: ``sshd_cluster(n=2, netns=None, **kw)`` (``kw``: :class:`SshdCluster`'s
  ``pci``, ...) starts ``n`` real sshd hosts
  (:class:`aios_cloud.testing.sshd.SshdCluster`) under the test's ``tmp_path``, closed at
  teardown; ``netns=True`` requires network namespaces (each host its own address).
* ``sshd_hosts``: two sshd hosts in their own network namespaces (a cloud cluster's machines).

When sshd hosts cannot run here the tests that need them skip with the reason (listed by aios's
end-of-session summary); with ``CI`` set to a true value a missing ``sshd`` (or, as root, missing
network namespaces) is a failure instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aios.testing.plugin import _unavailable

from aios_cloud import ssh
from aios_cloud.testing.sshd import SshdCluster, netns_available, sshd_unavailable_reason


@pytest.fixture
def sshd_cluster(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``sshd_cluster(n=2, netns=None)``: start ``n`` real sshd hosts (closed at teardown)."""

    started: list[Any] = []

    def start(n: int = 2, netns: bool | None = None, **kw: Any) -> Any:
        reason = sshd_unavailable_reason()
        if reason:
            _unavailable(reason)
        if netns and not netns_available():
            msg = "needs network namespaces (root + iproute2): the hosts need their own addresses"
            if os.geteuid() == 0:
                _unavailable(msg)
            pytest.skip(msg)
        cluster = SshdCluster(n, tmp_path / f"sshd{len(started) or ''}", netns=netns, **kw)
        started.append(cluster)
        return cluster

    yield start
    for c in reversed(started):
        c.close()
    if started:
        # the connections and agents this process opened to those hosts end with them: a
        # later test's hosts may get the same addresses and ports
        ssh.close_masters()


@pytest.fixture
def sshd_hosts(sshd_cluster: Callable[..., Any]) -> Any:
    """Two sshd hosts, each in its own network namespace (the machines of a cloud cluster)."""
    return sshd_cluster(2, netns=True)
