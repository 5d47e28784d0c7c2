"""Secrets in checkpoint URLs (user info, signed-URL query parameters) never reach what aios
writes or prints: a real run with ``checkpoint.dir=memory://admin:PASSWORD@bucket/ck`` saves,
then resumes; every file of its run records and all its output are searched for the password."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from aios.config.schema import redact_url
from aios.errors import CheckpointError
from aios.testing.zygote import python

PASSWORD = "Pw-d0nt-l3ak-7781"

SCRIPT = """
import aios, torch
rt = aios.init()
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = rt.setup(model, opt)
start = rt.resume()
for step in range(start, 4):
    rt.backward(model(torch.ones(2, 4)).sum())
    rt.step(opt)
path = rt.save()
print("saved", path is not None)
# the same process resumes from what it wrote (memory:// lives in this process)
rt.load()
print("reloaded step", rt.step if isinstance(rt.step, int) else "?")
rt.close()
"""


def test_url_password_is_redacted_everywhere(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    env.update(
        AIOS_LOGGING__RUN_DIR=str(tmp_path / "runs"),
        AIOS_LOGGING__TENSORBOARD="false",
        OMP_NUM_THREADS="1",
    )
    url = f"memory://admin:{PASSWORD}@bucket/ck"
    r = subprocess.run(
        [
            *python("-c", "from aios.cli.run import main; main()"),
            "--nprocs",
            "1",
            f"checkpoint.dir={url}",
            "checkpoint.every=2",
            str(script),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "saved True" in out, out
    assert "aios: checkpoints: memory://admin:***@bucket/ck" in out, out
    assert PASSWORD not in out
    records = [p for p in (tmp_path / "runs").rglob("*") if p.is_file()]
    assert {p.name for p in records} >= {"config.json", "diagnostics.json"}, records
    for p in records:
        assert PASSWORD.encode() not in p.read_bytes(), p
    diag = (next(p for p in records if p.name == "diagnostics.json")).read_text()
    assert "admin:***@bucket" in diag  # the checkpoints are recorded, redacted


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        (
            "gs://b/ck?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Credential=sa%40p.iam&X-Goog-Signature=abc123def",
            "abc123def",
        ),
        (
            "https://s3.amazonaws.com/b/k?X-Amz-Credential=AKIA1234&X-Amz-Signature=f00dfeed&X-Amz-Date=1",
            "f00dfeed",
        ),
        ("https://s3.amazonaws.com/b/k?X-Amz-Credential=AKIA1234%2F2026&X-Amz-Date=1", "AKIA1234"),
        ("https://acct.blob.core.windows.net/c/b?sv=2024&sig=s3cr3tsig%3D&se=1", "s3cr3tsig"),
        ("s3://user:hunter2@bucket/ck", "hunter2"),
    ],
)
def test_signed_url_parameters_and_user_info_are_redacted(url: str, secret: str) -> None:
    shown = redact_url(f"checkpoint '{url}/ckpt-000000004' is corrupt")
    assert secret not in shown and "***" in shown
    assert "X-Goog-Algorithm=GOOG4-RSA-SHA256" in redact_url(url) or "GOOG" not in url
    # errors go through the same function
    assert secret not in str(CheckpointError(f"cannot list '{url}'", f"check {url}"))
