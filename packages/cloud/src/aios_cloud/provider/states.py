"""The normalised cluster states and host health every provider maps its own onto."""

from __future__ import annotations

# ------------------------------------------------------------------------------ states

# Normalised cluster states. Providers map their own (TPU ``READY``/``PREEMPTED``, EC2
# ``running``/``stopped``) onto these.
PENDING = "PENDING"  # creating / queued / booting


QUEUED = "QUEUED"  # a queued resource waiting for capacity or its time window


READY = "READY"


STOPPING = "STOPPING"


STOPPED = "STOPPED"


STARTING = "STARTING"


DELETING = "DELETING"


PREEMPTED = "PREEMPTED"  # spot capacity taken back: the hosts are gone


TERMINATED = "TERMINATED"


FAILED = "FAILED"


UNKNOWN = "UNKNOWN"


STATES = (
    PENDING,
    QUEUED,
    READY,
    STOPPING,
    STOPPED,
    STARTING,
    DELETING,
    PREEMPTED,
    TERMINATED,
    FAILED,
    UNKNOWN,
)


HEALTHY = "HEALTHY"


UNHEALTHY = "UNHEALTHY"


# The cloud is maintaining the hosts (TPU ``UNHEALTHY_MAINTENANCE``). A host event on a VM of a
# TPU slice interrupts the whole slice (https://cloud.google.com/kubernetes-engine/docs/how-to/handle-disruption-gpu-tpu):
# the watcher treats it as lost hosts (managed recovery), never as something that resumes.
MAINTENANCE = "MAINTENANCE"
