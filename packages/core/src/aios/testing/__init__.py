"""Reusable test infrastructure for aios and its plugins.

* :mod:`aios.testing.plugin`: the pytest plugin (``pytest11`` entry point of aios-core) with the
  ``free_port`` and ``aios_cli`` fixtures and the end-of-session summary of skipped tests.
* :mod:`aios.testing.launch`: the one way tests start ``aios-run`` (``aios_run``, ``launch``,
  ``run_env``); its ranks start warm (:mod:`aios.launcher.warm`) as a user's do.

Real sshd hosts (``sshd_cluster``/``sshd_hosts``) are cloud test infrastructure: they live in
aios-cloud (:mod:`aios_cloud.testing`).
"""

from __future__ import annotations

import socket


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on (as of this call)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
