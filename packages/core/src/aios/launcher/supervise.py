"""``aios-run``'s run of a plan on this host (:func:`execute`): the workers' environment, the
hang watchdog, the launch path (torch's elastic agent in this process, or one child process) and
the end of the run through :func:`aios.launcher.outcome.conclude`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from contextlib import suppress as _suppress
from typing import Any

import click

from aios.config.process import explicit_config_json
from aios.errors import LaunchError
from aios.launcher import status as rank_status
from aios.launcher import warm
from aios.launcher.agent import AgentWatch, blame, run_elastic_inprocess
from aios.launcher.child import run_subprocess
from aios.launcher.contract import (
    BACKEND_ENV,
    CONFIG_ENV,
    LAUNCH_TIME_ENV,
    LAUNCHER_PID_ENV,
    RUN_ID_ENV,
    STATUS_DIR_ENV,
)
from aios.launcher.outcome import (
    PROG,
    Outcome,
    conclude,
    hint_from_stderr,
    name_unjoined,
    portability_hint,
)
from aios.launcher.ports import free_port, with_port
from aios.resilience import flightrec
from aios.resilience.watchdog import DEMAND_SIGNAL, Watchdog, echo_err
from aios.runrecord.records import new_run_id


def worker_env(cfg: Any, backend: str, run_id: str) -> dict[str, str]:
    """What every worker of a run is told: the resolved config, the backend, the run id."""
    return {CONFIG_ENV: explicit_config_json(cfg), BACKEND_ENV: backend, RUN_ID_ENV: run_id}


def execute(
    cfg: Any,
    spec: Any,
    plan: Any,
    notes: list[str],
    script: str,
    zygote: warm.Zygote | None = None,
    port_is_ours: bool = False,
) -> None:
    """Run a plan on this host and exit with the documented status. ``zygote``: the ranks are
    forked from it where that is safe (:mod:`aios.launcher.warm`); ``port_is_ours``: the master
    port is aios's own choice, replaced when another process takes it first."""
    if len(plan.hosts) != 1:
        raise LaunchError(
            f"the plan has {len(plan.hosts)} hosts; aios-run starts the processes of this host only",
            "run aios-run on every node with --node-rank, or use `aios launch` for clusters",
        )
    host = plan.hosts[0]
    run_id = os.environ.get(RUN_ID_ENV) or new_run_id()
    status_dir = rank_status.create()
    env = {
        # NCCL's flight recorder, dumped by the watchdog on a hang (unless the user set it up)
        **flightrec.worker_env(status_dir, {**os.environ, **host.env}),
        **host.env,
        **worker_env(cfg, spec.name, run_id),
        # when this attempt was launched (a cloud launcher's earlier time stands): the goodput
        # account's start-up begins here (aios.runrecord.goodput)
        LAUNCH_TIME_ENV: os.environ.get(LAUNCH_TIME_ENV) or repr(time.time()),
        STATUS_DIR_ENV: status_dir,
        LAUNCHER_PID_ENV: str(os.getpid()),
    }
    for n in [*plan.notes, *notes]:  # what the plan changed on its own is never silent
        click.echo(f"{PROG}: note: {n}", err=True)
    watch = AgentWatch(zygote)
    dog = None
    if zygote is not None and plan.preload:  # what the ranks import, before they fork
        zygote.preload(plan.preload, {**os.environ, **env}, plan.runtime_env)
    try:
        dog = start_watchdog(cfg, status_dir, run_id, watch, {**os.environ, **env})
        cmd = host.command
        if (
            plan.launcher == "elastic"
            and cmd[1:3] == ["-m", "torch.distributed.run"]
            and os.path.realpath(cmd[0]) == os.path.realpath(sys.executable)
        ):
            outcome = _elastic(cfg, script, cmd, env, status_dir, watch, port_is_ours)
        else:
            outcome = _child(script, cmd, env, plan.world_size, zygote)
        status = rank_status.read_ranks(status_dir)
        if outcome.ok and plan.launcher == "elastic":
            name_unjoined(status_dir, host.ranks, plan.world_size, watch.joined)
        conclude(outcome, cfg, script, plan.world_size, status, dog)
    finally:
        if zygote is not None:
            warm.reap_orphans()  # what the ranks left behind was reparented to this process
        _end_watchdog(dog, status_dir)
        shutil.rmtree(status_dir, ignore_errors=True)


def _elastic(
    cfg: Any,
    script: str,
    cmd: list[str],
    env: dict[str, str],
    status_dir: str,
    watch: AgentWatch,
    port_is_ours: bool,
) -> Outcome:
    """torch's elastic agent in this process over the plan's torchrun arguments."""
    logs = os.path.join(status_dir, "logs")  # the ranks' tee'd output, removed with status_dir
    targs = ["--log-dir", logs, *cmd[3:]]
    grace = cfg.checkpoint.grace_seconds
    kind, detail = run_elastic_inprocess(targs, env, grace, watch, port_is_ours)
    for _ in range(3):  # another run bound the free port aios chose before its store did
        if kind != "port-taken":
            break
        port = free_port(cfg.master_addr)
        click.echo(
            f"{PROG}: note: port {cfg.master_port} was taken by another process as this "
            f"run started; using {port}",
            err=True,
        )
        cfg = cfg.model_copy(update={"master_port": port})
        targs = with_port(targs, env, port)
        kind, detail = run_elastic_inprocess(targs, env, grace, watch, port_is_ours)
    if kind == "port-taken":
        raise detail
    if kind == "ok":
        return Outcome(ok=True)
    if kind == "signal":
        return Outcome(ok=False, signal=detail)
    failures = detail or {}

    def who() -> tuple[int | str, int, str | None]:
        if not failures:
            return 0, 1, None
        rank, failure = blame(failures, rank_status.read_ranks(status_dir), watch)
        return rank, failure.exitcode, portability_hint(script, logs, failure)

    return Outcome(ok=False, codes=[f.exitcode for f in failures.values()], blame=who)


def _child(
    script: str,
    cmd: list[str],
    env: dict[str, str],
    world: int,
    zygote: warm.Zygote | None = None,
) -> Outcome:
    """The plan's command as one child process (forked from ``zygote`` where that is safe)."""
    tail = bytearray()  # the end of its stderr, for the portability hint

    def spawn(args: list[str], child_env: dict[str, str], stderr: int | None) -> Any:
        if zygote is None:
            return None
        return zygote.spawn(args, child_env, None, stderr, plain=True)

    code = run_subprocess(cmd, {**os.environ, **env}, tail, spawn)

    def who() -> tuple[int | str, int, str | None]:
        hint = hint_from_stderr(script, tail.decode(errors="replace")) if code > 0 else None
        return 0 if world == 1 else "?", code, hint

    return Outcome(ok=code == 0, codes=[code] if code else [], blame=who)


def _end_watchdog(dog: Any, status_dir: str) -> None:
    """Stop the watchdog; keep the NCCL dumps a rank wrote by itself (a collective timed out)
    in the run record."""
    if dog is None:
        return
    dog.stop()
    with _suppress(ValueError):
        signal.signal(DEMAND_SIGNAL, signal.SIG_DFL)
    if not dog.hangs and dog.record_dir:
        kept = flightrec.keep_dumps(status_dir, os.path.join(dog.record_dir, "nccl"))
        if kept:
            click.echo(
                f"{PROG}: NCCL flight recorder dumps (a collective timed out): {kept} "
                f"(`torchfrtrace {kept}`)",
                err=True,
            )


def start_watchdog(
    cfg: Any, status_dir: str, run_id: str, watch: AgentWatch, rank_env: dict[str, str]
) -> Any:
    """The hang watchdog over this node's ranks (:mod:`aios.resilience.watchdog`), and SIGUSR1 for a dump
    of the live run (also with ``watchdog.enabled`` off, which only stops the hang checks).
    ``rank_env``: the environment the ranks run with (their NCCL flight recorder settings)."""
    settings = cfg.watchdog
    record = os.path.abspath(os.path.join(cfg.logging.run_dir, run_id))
    with open(os.path.join(status_dir, "run.json"), "w") as f:
        json.dump({"run_id": run_id, "run_dir": record, "launcher": os.getpid()}, f)
    dog = Watchdog(settings, status_dir, record, echo_err)
    dog.rank_env = rank_env

    def on_hang(action: str) -> None:
        if action == "restart":
            watch.hang_note = dog.hang["why"] if dog.hang else "hang"
        else:
            watch.no_restart = True
        dog.kill_workers()

    dog.on_hang = on_hang
    with _suppress(ValueError):  # not the main thread (aios run inside a test harness)
        signal.signal(DEMAND_SIGNAL, dog.request_dump)
    return dog.start()
