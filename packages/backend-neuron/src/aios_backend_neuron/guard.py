"""``python -m aios_backend_neuron.guard INSTANCE_TYPE -- COMMAND...``

A plan built from ``neuron.instance_type`` on a machine without Neuron devices (``--dry-run``
off-instance) is meant for a Trainium instance. Its command starts with this guard, so that
running it here by mistake is one clear error instead of N copies of the script on the CPU;
on a Trainium instance the guard finds the devices and ``exec``\\s the command unchanged.
No torch import.
"""

from __future__ import annotations

import os
import sys

from aios_backend_neuron.discovery import device_nodes, run_neuron_ls


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv or argv.index("--") != 1 or len(argv) < 3:
        print(
            "usage: python -m aios_backend_neuron.guard INSTANCE_TYPE -- COMMAND [ARGS...]",
            file=sys.stderr,
        )
        return 2
    instance, cmd = argv[0], argv[2:]

    if not device_nodes():
        res = run_neuron_ls()
        if res.topology is None or not res.topology.devices:
            print(
                f"aios-run: error: this plan is for a {instance} but this machine has no Neuron devices "
                f"({res.error or 'neuron-ls lists none'}); print it with --dry-run, or run it on the instance "
                f"(aios launch --cloud aws --instance-type {instance} ...)",
                file=sys.stderr,
            )
            return 2
    os.execvp(cmd[0], cmd)
    return 0  # pragma: no cover - exec does not return


if __name__ == "__main__":
    sys.exit(main())
