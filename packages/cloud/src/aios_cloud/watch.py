"""``python -m aios_cloud.watch JOB_ID``: the background watcher ``aios launch --detach`` starts.
It runs the same :class:`aios_cloud.Watcher` loop as a foreground launch (managed-spot
recovery included) without following logs, and records everything in the state database."""

from __future__ import annotations

import argparse
import sys

from aios.config.schema import resolve

from aios_cloud import records
from aios_cloud.lifecycle import down_cluster
from aios_cloud.provider.base import provisioning
from aios_cloud.ssh import LinePrinter
from aios_cloud.store import Store
from aios_cloud.watching import Watcher, WatchOptions


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="aios-watch")
    ap.add_argument("job_id", type=int)
    ap.add_argument("--cloud", required=True)
    ap.add_argument("--poll", type=float, default=5.0)
    ap.add_argument("--config")
    ap.add_argument("--down", action="store_true")
    a = ap.parse_args(argv)

    config = resolve(config_file=a.config, check_backend=False)
    provider = records.get_provider(a.cloud, config)  # looked up per call: tests stand it in
    name = job.cluster if (job := Store().get_job(a.job_id)) else str(a.job_id)
    store = Store()
    printer = LinePrinter(sys.stdout)
    opts = WatchOptions(poll=a.poll, describe_every=max(a.poll, 3 * a.poll), follow=False)
    code = Watcher(
        store, provisioning(provider, name), a.job_id, config, printer=printer, options=opts
    ).run()
    if a.down:
        job = store.get_job(a.job_id)
        rec = store.get_cluster(job.cluster) if job else None
        if rec:
            down_cluster(store, provider, rec)
    return code


if __name__ == "__main__":
    sys.exit(main())
