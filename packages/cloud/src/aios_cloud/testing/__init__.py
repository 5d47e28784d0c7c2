"""Test helpers for cloud providers and their plugins.

* :mod:`aios_cloud.testing.sshd`: real OpenSSH sshd hosts (the machines of a cloud cluster).
* :mod:`aios_cloud.testing.plugin`: the pytest plugin (entry point ``pytest11``) with the
  ``sshd_cluster`` and ``sshd_hosts`` fixtures.
"""
