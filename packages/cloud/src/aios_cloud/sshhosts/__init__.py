"""``--cloud ssh``: hosts the user already has (lab machines, a GPU box, a TPU VM created by hand).

``aios launch --cloud ssh --hosts USER@HOST[:PORT],... [--identity KEY] train.py`` (or
``--hosts-file FILE``: one host a line, ``#`` comments) runs the whole launch flow of
:mod:`aios_cloud.launch` on them. Nothing is provisioned: "create" is reaching and inspecting the
hosts; "delete" and "stop" only end aios's own processes and remove aios's own files there. The
machines themselves are never stopped, rebooted or deleted.

* **Reach and inspect** (:data:`PROBE`, one SSH command per host, nothing installed): its
  addresses (``ip -o -4 addr``), CPU count, NVIDIA GPUs (``nvidia-smi -L``), Neuron devices
  (``/dev/neuron*``), TPU chips (PCI vendor ``0x1ae0`` with a TPU device id, :mod:`aios.devices.pci`;
  gVNIC shares the vendor), the interpreter's Python and torch versions (package metadata, no
  import) and whether an aios job of a cluster of the same name already runs there (then
  nothing is touched: one line, exit 2).
* **Devices and processes per host**: ``-a auto`` (the default) trains on CPU and refuses hosts
  that have accelerators (pass ``-a gpu|tpu|trainium``, or ``-a cpu`` to use the CPUs anyway);
  the processes per host are the accelerator count found (1 on CPU), or ``--nprocs-per-host``.
  They are recorded with each host and the launch plan uses them.
* **Master address**: the first host's address *as the other hosts see it*: the address of worker
  0 in a subnet where every host has its own address (the subnet of its SSH address first), or
  the one in ``--network CIDR``; when the hosts share no subnet, its SSH address, said in one line.
  Node ranks follow the host list.
* **Version-set check and aios's own discovery**: after setup, every host runs ``python -m
  aios.plugins.versions STACK`` for the backend's stack (cpu: torch must be installed) and ``aios devices
  --backend B --json`` (the backend must find a usable device); a failure is one line naming the
  host.
* **Managed restarts** (``--max-restarts N``): when a host is lost (its job processes died, it
  rebooted, its sshd stopped answering) the watcher ends the job on the other hosts, waits up to
  ``--host-wait`` seconds (default 120) for *every* host of the list to answer again and restarts
  the job on all of them from the newest checkpoint (same node ranks, same master). A host still
  down after that fails the attempt with one line naming it; the next restart tries again until
  the restarts are used up. aios does not go on without the host: the runtime resumes a
  checkpoint only at the world size that wrote it. The checkpoint directory is a bucket URL or an
  absolute path on a filesystem every host mounts; aios checks it is shared (a file written on
  worker 0 must be visible on every host) before the job starts.
* **What aios removes** (``aios down``; ``aios stop`` only ends the processes): in
  ``~/aios/<cluster>/`` on every host: ``jobs/`` (run.sh, env, pid, logs, exit codes),
  ``setup.sha``, ``agent.*``, ``code.new``, ``code/.aios-site`` (aios itself), the synced files
  the host's ``fleet/manifest.json`` lists, ``fleet/`` itself (the sync's store and the head's
  key) and the head key's line in ``~/.ssh/authorized_keys`` (only that line). Files the job
  wrote under ``code/`` (checkpoints, runs) are kept and named; the directory goes only when
  empty. A host that does not answer keeps its files (named).
* Host keys are pinned at the first connection (aios's per-cluster known_hosts); a changed host
  key is never trusted by itself: the launch, ``aios start`` or the managed restart stops with one
  line, and ``aios stop``/``down`` leave that host untouched (named).
"""

from __future__ import annotations

from aios_cloud.sshhosts.hosts import HostSpec, SshHost, parse_hosts, read_hosts_file, split_hosts
from aios_cloud.sshhosts.probe import Probe, internal_addresses, probe_command
from aios_cloud.sshhosts.provider import SshHostsProvider
from aios_cloud.sshhosts.shell import cleanup_command

__all__ = [
    "HostSpec",
    "Probe",
    "SshHost",
    "SshHostsProvider",
    "cleanup_command",
    "internal_addresses",
    "parse_hosts",
    "probe_command",
    "read_hosts_file",
    "split_hosts",
]
