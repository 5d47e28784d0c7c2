"""The `aios` CLI: no torch on non-training paths, one-line errors, broken plugins never fatal."""

from __future__ import annotations

import json
from pathlib import Path

import aios

NO_TORCH = """
import sys
sys.argv = ['aios', *{args!r}]
from aios.cli.main import main
try:
    main()
except SystemExit as e:
    code = e.code
else:
    code = 0
heavy = sorted(m for m in ('torch', 'torch_xla', 'boto3', 'google.cloud', 'deepspeed', 'pydantic') if m in sys.modules)
print('HEAVY=' + ','.join(heavy), file=sys.stderr)
sys.exit(code)
"""


def _heavy(res) -> list[str]:
    line = [ln for ln in res.stderr.splitlines() if ln.startswith("HEAVY=")][-1]
    return [m for m in line[len("HEAVY=") :].split(",") if m]


def test_aios_imports_from_this_checkout():
    here = Path(__file__).resolve().parents[1] / "src" / "aios"
    assert Path(aios.__file__).resolve().parent == here


def test_help_imports_no_torch_and_no_pydantic(run_aios, tmp_path):
    res = run_aios("--help")
    assert res.returncode == 0
    assert "plugins" in res.stdout and "devices" in res.stdout
    code = NO_TORCH.format(args=["--help"])
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"))
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert res.returncode == 0
    assert _heavy(res) == []


def test_plugins_devices_doctor_config_import_no_torch():
    import os
    import subprocess
    import sys

    env = dict(
        os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"), COLUMNS="200"
    )
    for args in (
        ["plugins"],
        ["plugins", "--json"],
        ["devices"],
        ["devices", "--json"],
        ["env"],
        ["config", "show"],
        ["doctor", "--backend", "cpu"],
        ["check", str(Path(__file__).parent / "scripts" / "check" / "gpu_ddp_ported.py")],
    ):
        res = subprocess.run(
            [sys.executable, "-c", NO_TORCH.format(args=args)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert res.returncode == 0, (args, res.stderr)
        assert "torch" not in _heavy(res), args


def test_broken_plugin_is_an_error_line_while_help_and_devices_work(
    site, run_aios, write_dist, backend_plugin
):
    write_dist(site, "aios-broken", "broken_plugin", "raise ImportError('needs libwidget')\n")
    write_dist(site, "aios-widget", "widget_plugin", backend_plugin("widget", 5, True))
    assert run_aios("--help").returncode == 0
    devs = run_aios("devices", "--json")
    assert devs.returncode == 0, devs.stderr
    assert {"cpu", "widget"} <= {d["backend"] for d in json.loads(devs.stdout)}
    table = run_aios("devices")
    assert (
        'plugin error: "aios-broken": Error importing plugin: ImportError: needs libwidget'
        in table.stderr
    )
    plug = run_aios("plugins")
    assert plug.returncode == 0
    assert (
        'error: plugin "aios-broken": Error importing plugin: ImportError: needs libwidget'
        in plug.stdout
    )
    strict = run_aios("plugins", env={"AIOS_STRICT_PLUGINS": "1"})
    assert strict.returncode == 2
    assert strict.stderr.strip().splitlines() == [
        'aios: error: plugin "aios-broken": Error importing plugin: ImportError: needs '
        "libwidget; fix or uninstall it, or unset AIOS_STRICT_PLUGINS"
    ]


def test_config_errors_exit_2_with_one_line_and_debug_shows_traceback(run_aios):
    res = run_aios("config", "validate", "precision=fp8")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "aios: error: invalid value 'fp8' for 'precision' (from override); choose one of: "
        "fp32, bf16-mixed, fp16-mixed, bf16-true"
    ]
    dbg = run_aios("--debug", "config", "validate", "precision=fp8")
    assert dbg.returncode == 2 and "Traceback" in dbg.stderr
    ok = run_aios("config", "validate", "precision=bf16-true")
    assert ok.returncode == 0 and ok.stdout.strip() == "config ok"


def test_unknown_backend_for_devices_is_one_line(run_aios):
    res = run_aios(
        "devices",
        "--backend",
        "xla",
        env={"AIOS_DISABLE_PLUGINS": "aios-backend-xla,aios-backend-neuron,aios-cloud-gcp"},
    )
    assert res.returncode == 2
    assert res.stderr.strip() == (
        "aios: error: backend 'xla' is not installed; run: pip install -e './packages/core[xla]' ./packages/backend-xla"
        " (from the aios checkout)"
    )


def test_env_redacts_secrets(run_aios):
    res = run_aios(
        "env",
        "--json",
        env={
            "WANDB_API_KEY": "sekrit-123",
            "AWS_SECRET_ACCESS_KEY": "abc",
            "AIOS_TEST_TOKEN": "tok",
        },
    )
    assert res.returncode == 0, res.stderr
    assert "sekrit-123" not in res.stdout and "abc" not in json.loads(res.stdout)["env"].values()
    data = json.loads(res.stdout)
    assert data["env"]["WANDB_API_KEY"] == "***"
    assert data["aios-core"] == aios.__version__


def test_config_show_redacts_and_reports_precedence(tmp_path, run_aios):
    f = tmp_path / "c.yaml"
    f.write_text("precision: bf16-mixed\nseed: 3\n")
    res = run_aios(
        "config", "show", "--json", "--config", str(f), "seed=9", env={"AIOS_GRAD_ACCUM": "4"}
    )
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert (data["precision"], data["seed"], data["grad_accum"]) == ("bf16-mixed", 9, 4)


def test_doctor_reports_checks_and_fails_with_exit_1_on_failures(site, run_aios, write_dist):
    write_dist(
        site,
        "aios-sick",
        "sick_plugin",
        """
        from aios import hookimpl
        from aios.types import DoctorCheck

        @hookimpl
        def aios_doctor_checks(backend, config):
            return [DoctorCheck("widget driver", "fail", "driver 1.0 too old", "upgrade the widget driver")]
    """,
    )
    res = run_aios("doctor", "--json")
    checks = json.loads(res.stdout)
    assert res.returncode == 1
    sick = [c for c in checks if c["name"] == "widget driver"][0]
    assert sick["plugin"] == "aios-sick" and sick["fix"] == "upgrade the widget driver"
    assert any(c["name"] == "torch installed" and c["status"] == "pass" for c in checks)


def test_plugins_lists_strategies_accelerators_and_cluster_envs(run_aios):
    res = run_aios("plugins", "--json")
    assert res.returncode == 0, res.stderr
    plugins = {p["name"]: p for p in json.loads(res.stdout)["plugins"]}
    core = plugins["aios-core"]
    strategies = {s["name"]: s for s in core["strategies"]}
    assert {"fsdp", "ddp", "tp", "hsdp"} <= set(strategies)
    assert strategies["fsdp"]["accelerators"] == ["*"]  # any native accelerator
    assert "cpu" in core["accelerators"]
    assert {"slurm", "kubernetes"} <= set(core["cluster_environments"])
    cuda = {s["name"]: s for s in plugins["aios-backend-cuda"]["strategies"]}
    assert "deepspeed" in cuda and "cuda" in cuda["deepspeed"]["backends"]
    assert "deepspeed" not in strategies
    table = run_aios("plugins", env={"COLUMNS": "400"})
    assert table.returncode == 0, table.stderr
    # the aios-core row: its first line and the lines its cells wrap onto (no name of their own)
    lines = table.stdout.splitlines()
    first = next(i for i, ln in enumerate(lines) if "│ aios-core " in ln)
    row = [lines[first]]
    for ln in lines[first + 1 :]:
        if not ln.startswith("│") or not ln[1:].split("│", 1)[0].strip() == "":
            break
        row.append(ln)
    core_rows = " ".join(" ".join(c.strip() for c in ln.split("│")) for ln in row)
    for item in (
        "accelerator:cpu",
        "strategy:fsdp(any accelerator)",
        "cluster-env:slurm",
        "cluster-env:kubernetes",
    ):
        assert item in core_rows, (item, table.stdout)
    cuda_row = "".join(ln for ln in table.stdout.splitlines() if "aios-backend-cuda" in ln)
    assert "strategy:deepspeed(cuda cpu)" in cuda_row, table.stdout
