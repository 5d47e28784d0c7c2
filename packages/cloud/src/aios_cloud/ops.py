"""What the cloud commands do, by job (this module re-exports them for code written against
it; import from the modules themselves):

* :mod:`aios_cloud.records`: cluster and host records, the runner for them, refresh;
* :mod:`aios_cloud.head`: the head fan-out (worker 0 drives the other hosts);
* :mod:`aios_cloud.jobs`: sync, setup, the per-host commands, start, poll, cancel;
* :mod:`aios_cloud.watching`: log following and the watcher (managed recovery);
* :mod:`aios_cloud.lifecycle`: provision, stop/start/down and the autostop agent;
* :mod:`aios_cloud.signals`: signal handling and the open-file limit.
"""

from __future__ import annotations

from aios_cloud.head import (
    FAN_PARALLEL,
    HELPER_PYTHON,
    Head,
    command_timeout,
    reach_timeout,
    run_via_head,
    setup_timeout,
)
from aios_cloud.jobs import (
    JobSpec,
    cancel_job,
    env_file,
    host_commands,
    job_env,
    parse_env,
    poll_job,
    reach,
    render_run_sh,
    run_setup,
    setup_script,
    shell_word,
    start_job,
    sync_code,
)
from aios_cloud.lifecycle import (
    autostop_of,
    down_cluster,
    install_agent,
    provision,
    reinstall_agent,
    remember_autostop,
    remove_agent,
    start_cluster,
    stop_cluster,
)
from aios_cloud.records import (
    Log,
    cloud_name,
    cluster_key,
    dry_run_lines,
    get_provider,
    info_from,
    installed_clouds,
    inventory,
    placeholder_hosts,
    record_hosts,
    refresh,
    remote_root,
    request_dict,
    request_from_record,
    require_cluster,
    runner_for,
    runner_for_name_reset,
    save_hosts,
    with_public_key,
)
from aios_cloud.signals import (
    MIN_OPEN_FILES,
    check_open_files,
    install_signal_handlers,
    signals_deferred,
    terminated,
)
from aios_cloud.watching import (
    LogFollower,
    Watcher,
    WatchOptions,
    after_watch_failure,
)

__all__ = [
    "cloud_name",
    "info_from",
    "request_dict",
    "FAN_PARALLEL",
    "HELPER_PYTHON",
    "Head",
    "JobSpec",
    "Log",
    "LogFollower",
    "MIN_OPEN_FILES",
    "WatchOptions",
    "Watcher",
    "after_watch_failure",
    "autostop_of",
    "cancel_job",
    "check_open_files",
    "cluster_key",
    "command_timeout",
    "down_cluster",
    "dry_run_lines",
    "env_file",
    "get_provider",
    "host_commands",
    "install_agent",
    "install_signal_handlers",
    "installed_clouds",
    "inventory",
    "job_env",
    "parse_env",
    "placeholder_hosts",
    "poll_job",
    "provision",
    "reach",
    "reach_timeout",
    "record_hosts",
    "refresh",
    "reinstall_agent",
    "remember_autostop",
    "remote_root",
    "remove_agent",
    "render_run_sh",
    "request_from_record",
    "require_cluster",
    "run_setup",
    "run_via_head",
    "runner_for",
    "runner_for_name_reset",
    "save_hosts",
    "setup_script",
    "setup_timeout",
    "shell_word",
    "signals_deferred",
    "start_cluster",
    "start_job",
    "stop_cluster",
    "sync_code",
    "terminated",
    "with_public_key",
]
