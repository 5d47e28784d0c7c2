"""aios-cloud-aws against naive baselines, side by side in one run:

* Zone failover: time to land a 2-node launch in the third availability zone when the first two
  answer RunInstances with InsufficientInstanceCapacity (HTTP 500, as EC2 does). aios sends
  RunInstances without botocore retries and moves on at once; the baseline is the same code with
  boto3's standard retries on RunInstances (what a plain boto3 script gets: the 500 is retried
  with backoff in a zone that has no capacity). Real boto3 against moto behind the EC2 proxy.
* Spot watcher overhead: median CPU training-step time with the IMDSv2 spot watcher polling a
  local IMDS stand-in 100x more often than the default (every 0.05 s), against no watcher.

    python packages/cloud-aws/bench/bench_aws.py [--repeats 3] [--steps 300]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path


def bench_failover(repeats: int) -> None:
    from aios_cloud.failover import create_with_failover
    from aios_cloud.provider import ClusterRequest
    from aios_cloud_aws.provider import AwsProvider
    from aios_cloud_aws.settings import AwsSettings, neuron_ami_parameter
    from aios_cloud_aws.testing.ec2proxy import Ec2Proxy
    from aios_cloud_aws.testing.moto import MotoServer, aws_env, seed_public_parameter

    key = Path(tempfile.mkdtemp()) / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    pub = key.with_suffix(".pub").read_text()
    times: dict[str, list[float]] = {"aios": [], "boto3 retries": []}
    with (
        MotoServer() as moto,
        Ec2Proxy(moto.endpoint) as proxy,
        aws_env(moto.endpoint, proxy.endpoint),
    ):
        import boto3

        for i in range(repeats):
            for label, retry in (("aios", False), ("boto3 retries", True)):
                moto.reset()
                proxy.clear()
                ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=moto.endpoint)
                ami = ec2.register_image(Name="dlami", RootDeviceName="/dev/sda1")["ImageId"]
                seed_public_parameter(neuron_ami_parameter("trn1.32xlarge"), ami)
                proxy.inject(
                    "RunInstances",
                    "InsufficientInstanceCapacity",
                    "no capacity",
                    zones=["us-east-1a", "us-east-1b"],
                )
                p = AwsProvider(
                    settings=AwsSettings(zones=["us-east-1a", "us-east-1b", "us-east-1c"]),
                    poll_interval=0.02,
                    retry_capacity_errors=retry,
                )
                req = p.validate(
                    ClusterRequest(
                        name=f"b{i}", accelerator="trn1.32xlarge", nodes=2, ssh_public_key=pub
                    )
                )
                t0 = time.perf_counter()
                res = create_with_failover(p, req, p.zones(req.accelerator), sleep=lambda s: None)
                times[label].append(time.perf_counter() - t0)
                assert res.zone == "us-east-1c"
                calls = len(proxy.called("RunInstances"))
                p.delete(req.name, None)
                print(
                    f"  run {i + 1} {label:14s} {times[label][-1]:6.2f} s  RunInstances calls: {calls}"
                )
    a, b = statistics.median(times["aios"]), statistics.median(times["boto3 retries"])
    print(f"failover to the 3rd zone: aios {a:.2f} s, baseline {b:.2f} s -> {b / a:.2f}x faster")


def bench_watcher(steps: int, repeats: int) -> None:
    import torch
    from aios_cloud_aws.imds import SpotInterruptionWatcher
    from aios_cloud_aws.testing.imds import ImdsServer

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256)

    def run() -> float:
        per = []
        for _ in range(steps):
            t0 = time.perf_counter()
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            per.append(time.perf_counter() - t0)
        return statistics.median(per)

    run()  # warm-up
    base, watched, ratios = [], [], []
    with ImdsServer() as imds:
        for i in range(repeats):

            def with_watcher() -> float:
                w = SpotInterruptionWatcher(interval=0.05, base=imds.endpoint)
                w.start(lambda reason: None)
                try:
                    return run()
                finally:
                    w.stop()

            if i % 2:  # alternate the order: the machine is shared
                watched.append(with_watcher())
                base.append(run())
            else:
                base.append(run())
                watched.append(with_watcher())
            ratios.append(watched[-1] / base[-1])
        polls = imds.notice_gets
    b, w_ = statistics.median(base), statistics.median(watched)
    print(
        f"step time: no watcher {b * 1e3:.3f} ms, watcher polling every 0.05 s {w_ * 1e3:.3f} ms -> "
        f"median paired ratio {statistics.median(ratios):.3f} ({polls} IMDS polls)"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--watcher-repeats", type=int, default=9)
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    print("== zone failover (moto + EC2 proxy)")
    bench_failover(args.repeats)
    print("== spot watcher overhead (CPU training step)")
    bench_watcher(args.steps, args.watcher_repeats)


if __name__ == "__main__":
    main()
