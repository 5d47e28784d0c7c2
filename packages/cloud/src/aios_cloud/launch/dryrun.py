"""Stage 2 (:func:`render`, ``--dry-run``): the path the launch takes, printed; nothing changes."""

from __future__ import annotations

from aios_cloud.dryrun import render_launch
from aios_cloud.launch.checks import check_autostop
from aios_cloud.launch.context import Launch
from aios_cloud.launch.pricing import cost_limit_line, price_lines
from aios_cloud.provider.base import LaunchPlan

# ------------------------------------------------------------------------------ 2. dry run


def render(launch: Launch) -> None:
    """``--dry-run``: the provider renders every step the launch would take; nothing is called."""
    request, provider, cluster = launch.request, launch.provider, launch.cluster
    line = None
    if request.autostop is not None:
        check_autostop(provider, cluster, request.autodown)
        if not launch.existing:
            cluster = provider.prepare_autostop(cluster, request.autostop_action, dry_run=True)
        line = (
            f"# 5. autostop: an agent on worker 0 runs `{launch.spec.python} -m aios_cloud.agent "
            f"~/aios/{cluster.name}/agent.json` and "
            f"{'deletes' if request.autodown else 'stops'} the cluster after "
            f"{request.autostop:g} min without a running job (a @reboot crontab entry restarts "
            "it after a reboot; reinstalled after recovery and `aios start`)"
        )
    for price in price_lines(launch):
        launch.echo(price)
    limit_line = cost_limit_line(launch)
    if limit_line:
        launch.echo(limit_line)
    provider.render_launch(
        LaunchPlan(
            cluster,
            launch.spec,
            launch.config,
            existing=launch.existing is not None,
            key_path=request.ssh_key,
            autostop_line=line,
            standard=render_launch,
        ),
        launch.echo,
    )
