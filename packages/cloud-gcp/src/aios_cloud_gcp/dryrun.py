"""Dry-run rendering: the ``gcloud`` commands equivalent to each step (no Google call)."""

from __future__ import annotations

from aios_cloud.provider.data import CloudCommand, ClusterRequest

from aios_cloud_gcp.access import GcpAccess


class GcpDryRun(GcpAccess):
    """The TPU provider's dry-run rendering."""

    # -------------------------------------------------------------- dry run
    def render_create(self, request: ClusterRequest) -> list[CloudCommand]:
        plan = self.plan_create(request)
        pre = []
        if self.settings.os_login:
            pre.append(
                CloudCommand(
                    [
                        "gcloud",
                        "compute",
                        "os-login",
                        "ssh-keys",
                        "add",
                        "--key-file=<aios public key file>",
                        f"--project={plan.project}",
                    ],
                    "OS Login: log in as the profile's POSIX user",
                )
            )
        if plan.kind == "queued":
            return [
                *pre,
                CloudCommand(plan.gcloud_argv(), "queued resource: waits for capacity"),
                CloudCommand(
                    [
                        "gcloud",
                        "compute",
                        "tpus",
                        "queued-resources",
                        "describe",
                        request.name,
                        f"--project={plan.project}",
                        f"--zone={plan.zone}",
                    ],
                    "poll until ACTIVE",
                ),
            ]
        return [*pre, CloudCommand(plan.gcloud_argv())]

    def render(self, action: str, name: str, zone: str | None) -> list[CloudCommand]:
        project = self.project()
        if action == "list":
            return [
                CloudCommand(
                    [
                        "gcloud",
                        "compute",
                        "tpus",
                        "tpu-vm",
                        "list",
                        f"--project={project}",
                        f"--zone={zone or '-'}",
                        "--filter=labels.aios-cluster:*",
                    ]
                )
            ]
        argv = [
            "gcloud",
            "compute",
            "tpus",
            "tpu-vm",
            action,
            name,
            f"--project={project}",
            f"--zone={zone}",
        ]
        if action == "delete":
            return [
                CloudCommand(
                    [
                        "gcloud",
                        "compute",
                        "tpus",
                        "queued-resources",
                        "delete",
                        name,
                        f"--project={project}",
                        f"--zone={zone}",
                        "--force",
                        "--quiet",
                    ],
                    "if it was queued",
                ),
                CloudCommand([*argv, "--quiet"]),
            ]
        return [CloudCommand(argv)]
