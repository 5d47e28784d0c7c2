"""The third-party template plugin, installed with pip from examples/plugin-template, is usable
with `aios-run --backend template` without any change to aios."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def template_site(install_plugin, root):
    target = install_plugin(root / "examples" / "plugin-template")
    assert list(target.glob("aios_backend_template-0.1.0.dist-info"))
    return target


def test_template_plugin_is_listed_with_all_first_party_plugins(
    aios_cli, template_site, first_party
):
    res = aios_cli(
        "plugins", "--json", pythonpath=[template_site], env={"AIOS_STRICT_PLUGINS": "1"}
    )
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    names = {p["name"]: p for p in data["plugins"]}
    assert set(first_party) | {"aios-backend-template"} <= set(names)
    tpl = names["aios-backend-template"]
    assert tpl["version"] == "0.1.0" and tpl["backends"] == ["template"]
    assert {
        "aios_register_backends",
        "aios_register_strategies",
        "aios_register_accelerators",
        "aios_config_sections",
    } <= set(tpl["hooks"])


def test_template_backend_devices_doctor_and_config(aios_cli, template_site):
    devs = aios_cli("devices", "--backend", "template", "--json", pythonpath=[template_site])
    assert devs.returncode == 0, devs.stderr
    (rep,) = json.loads(devs.stdout)
    assert rep["backend"] == "template" and rep["available"] is True
    bad = aios_cli("config", "validate", "template.threads=0", pythonpath=[template_site])
    assert bad.returncode == 2 and "'template.threads'" in bad.stderr
    doc = aios_cli("doctor", "--backend", "template", "--json", pythonpath=[template_site])
    assert any(
        c["name"] == "template device" and c["status"] == "pass" for c in json.loads(doc.stdout)
    )


def test_template_backend_dry_run_and_real_run(aios_cli, template_site, root, tmp_path):
    dry = aios_cli(
        "--backend",
        "template",
        "--nprocs",
        "2",
        "template.threads=1",
        "--dry-run",
        str(root / "examples" / "gpt.py"),
        prog="aios-run",
        pythonpath=[template_site],
    )
    assert dry.returncode == 0, dry.stderr
    assert (
        "template" in dry.stdout
        and "TEMPLATE_DEVICE=1" in dry.stdout
        and "torch.distributed.run" in dry.stdout
    )
    # strategies come from the registry: a name the backend cannot run is one line, never DDP
    bad = aios_cli(
        "--backend",
        "template",
        "strategy=spmd",
        "--dry-run",
        str(root / "examples" / "gpt.py"),
        prog="aios-run",
        pythonpath=[template_site],
    )
    (line,) = bad.stderr.strip().splitlines()
    assert (
        bad.returncode == 2 and "strategy 'spmd' is not available on the template backend" in line
    ), bad.stderr
    assert "strategies on template: auto, ddp, fsdp, hsdp, tp" in line
    script = tmp_path / "tiny.py"
    script.write_text(
        "import torch, aios\n"
        "rt = aios.init()\n"
        "model = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "model, opt = rt.setup(model, opt)\n"
        "x = torch.ones(8, 4, device=rt.device)\n"
        "for _ in range(3):\n"
        "    loss = model(x).pow(2).mean()\n"
        "    rt.backward(loss)\n"
        "    rt.step(opt)\n"
        "rt.print(f'backend={rt.backend} strategy={type(rt.strategy).__name__} world={rt.world_size}')\n"
    )
    run = aios_cli(
        "--backend",
        "template",
        "--nprocs",
        "2",
        str(script),
        prog="aios-run",
        pythonpath=[template_site],
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "backend=template strategy=TemplateStrategy world=2" in run.stdout
