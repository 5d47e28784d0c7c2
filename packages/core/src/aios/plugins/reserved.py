"""The names core reserves: its commands and its top-level config keys. Data only, so that the
CLI (:mod:`aios.cli.main`, which builds the command group from :data:`COMMANDS`), the config
(:mod:`aios.config.schema`, whose ``AiosConfigBase`` fields are :data:`CONFIG_KEYS`, a test holds them
equal) and the plugin registry (:mod:`aios.plugins.registry`, which refuses a plugin command or config
section that would replace one of these) share them without importing each other."""

from __future__ import annotations

__all__ = ["COMMANDS", "CONFIG_KEYS"]

#: the top-level keys of core's config (``AiosConfigBase``): a plugin's config section may not
#: take one of these names
CONFIG_KEYS = frozenset(
    {
        "backend", "checkpoint", "deterministic", "fsdp", "ft", "global_batch", "grad_accum",
        "grad_clip", "launch", "logging", "master_addr", "master_port", "mesh", "micro_batch",
        "nnodes", "node_rank", "nprocs", "precision", "seed", "strategy", "watchdog",
    }
)  # fmt: skip

# name -> (module, attribute, short help). Help text lives here so --help imports nothing.
# Plugins add commands through the ``aios_register_commands`` hook (aios-cloud: launch, status,
# exec, ...); those are listed from their specs and imported only when invoked.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "plugins": ("aios.cli.info", "plugins", "List plugins: name, version, hooks, load errors."),
    "devices": ("aios.cli.info", "devices", "Show the devices each backend finds."),
    "env": ("aios.cli.info", "env", "Versions and settings for bug reports (secrets redacted)."),
    "doctor": ("aios.cli.configured", "doctor", "Run health checks contributed by the backends."),
    "config": ("aios.cli.configured", "config", "Show or validate the resolved config."),
    "run": ("aios.cli.run", "run_command", "Launch a training script (same as aios-run)."),
    "check": (
        "aios.cli.check",
        "check",
        "Find what ties training scripts to one accelerator (static, no torch).",
    ),
    "stacks": ("aios.cli.stacks", "stacks", "Every rank's stack of a live run (no stop)."),
    "report": (
        "aios.cli.report",
        "report",
        "Goodput: what a run's time went to, every attempt (--json, --html).",
    ),
}
