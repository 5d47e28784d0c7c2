"""How to install a first-party plugin that is NOT installed: the one place core names them.

Core never imports a plugin and never decides what is available by this table: the plugin
registry (:mod:`aios.plugins.registry`) knows what is installed, and each plugin declares its own
backends, clouds and commands through its hooks. This table only turns "unknown backend
'xla'" into "install it like this" when the name is one the aios checkout ships. It imports
nothing, so the registry, the config and the CLI may all read it without an import edge between
them. The public registry's ``aios``/``aios-core`` are unrelated projects: every line installs
from the aios checkout.
"""

from __future__ import annotations

__all__ = ["BACKENDS", "CLOUDS", "CLOUD_COMMANDS", "CLOUD_INSTALL", "CORE", "hint"]

CORE = "pip install -e ./packages/core (from the aios checkout)"

#: backend name -> the install line of the package that provides it
BACKENDS: dict[str, str] = {
    "cuda": "pip install -e './packages/core[cuda]' ./packages/backend-cuda (from the aios checkout)",
    "tpu": "pip install -e ./packages/core ./packages/backend-xla torch==2.13.0 torch_tpu==0.2.0 "
    "(from the aios checkout, on a Cloud TPU VM)",
    "xla": "pip install -e './packages/core[xla]' ./packages/backend-xla (from the aios checkout)",
    "neuron": "pip install -e './packages/core[neuron]' ./packages/backend-xla "
    "./packages/backend-neuron (from the aios checkout), plus torch-neuronx from the AWS Neuron "
    "index",
}

#: cloud name -> the install line of the package that provides it
CLOUDS: dict[str, str] = {
    "gcp": "pip install -e './packages/core[gcp]' ./packages/cloud ./packages/backend-xla "
    "./packages/cloud-gcp (from the aios checkout)",
    "aws": "pip install -e './packages/core[aws]' ./packages/cloud ./packages/cloud-aws "
    "(from the aios checkout)",
    "ssh": "pip install -e ./packages/core ./packages/cloud (from the aios checkout)",
    "slurm": "pip install -e ./packages/core ./packages/cloud ./packages/cloud-slurm "
    "(from the aios checkout)",
    "k8s": "pip install -e ./packages/core ./packages/cloud ./packages/cloud-k8s "
    "(from the aios checkout)",
}

#: the commands aios-cloud contributes: when it is not installed, ``aios launch`` says how to
#: install it instead of "no such command"
CLOUD_COMMANDS = (
    "launch", "status", "exec", "logs", "ssh", "sync", "stop", "start", "down",
    "cancel", "autostop", "catalog", "cost",
)  # fmt: skip
CLOUD_INSTALL = (
    "pip install -e ./packages/core ./packages/cloud ./packages/cloud-gcp "
    "(from the aios checkout; or ./packages/cloud-aws, ./packages/cloud-slurm, ./packages/cloud-k8s)"
)


def hint(kind: str, name: str) -> str | None:
    """The install line for a first-party ``backend`` or ``cloud`` named ``name``, if any."""
    return (BACKENDS if kind == "backend" else CLOUDS).get(name)
