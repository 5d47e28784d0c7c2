"""Config: one validated schema, documented precedence, one-line errors."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict

from aios.config import parse_overrides, redact, resolve
from aios.errors import ConfigError


class WidgetSection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    depth: int = 2
    mode: str = "fast"


SECTIONS = {"widget": ("aios-widget", WidgetSection)}


def _resolve(**kw):
    kw.setdefault("environ", {})
    kw.setdefault("sections", {})
    kw.setdefault("check_backend", False)
    return resolve(**kw)


def test_defaults():
    cfg = _resolve()
    assert (cfg.backend, cfg.precision, cfg.nprocs, cfg.checkpoint.dir) == ("auto", "fp32", "auto", None)


def test_precedence_file_env_override_flag(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("precision: bf16-mixed\nseed: 1\ngrad_accum: 2\nnnodes: 3\ncheckpoint:\n  every: 5\n")
    env = {"AIOS_SEED": "2", "AIOS_GRAD_ACCUM": "4", "AIOS_CHECKPOINT__EVERY": "7"}
    cfg = _resolve(config_file=str(f), environ=env, overrides=["grad_accum=8"], flags={"seed": None, "nnodes": 4})
    assert cfg.precision == "bf16-mixed"  # file only
    assert cfg.seed == 2  # env beats file; a None flag is "not given"
    assert cfg.grad_accum == 8  # override beats env
    assert cfg.nnodes == 4  # flag beats file
    assert cfg.checkpoint.every == 7


def test_config_file_from_env(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("master_port: 1234\n")
    assert _resolve(environ={"AIOS_CONFIG": str(f)}).master_port == 1234


def test_control_env_vars_are_not_config_keys():
    cfg = _resolve(environ={"AIOS_HOME": "/x", "AIOS_PLUGINS": "a", "AIOS_RUN_CONFIG": "{}", "AIOS_DEBUG": "1"})
    assert cfg.backend == "auto"


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({"overrides": ["precision=fp8"]}, "invalid value 'fp8' for 'precision' (from override); choose one of: fp32, bf16-mixed, fp16-mixed, bf16-true"),
        ({"overrides": ["nnodes=two"]}, "invalid value 'two' for 'nnodes' (from override)"),
        ({"overrides": ["bogus=1"]}, "unknown config key 'bogus' (from override); valid keys here: backend, precision"),
        ({"overrides": ["checkpoint.dirr=x"]}, "unknown config key 'checkpoint.dirr' (from override); valid keys here: dir, every, keep"),
        ({"environ": {"AIOS_LOGGING__LEVEL": "loud"}}, "invalid value 'loud' for 'logging.level' (from environment); choose one of: debug, info, warning, error"),
        ({"overrides": ["nprocs=0"]}, "invalid value 0 for 'nprocs' (from override)"),
        ({"overrides": ["xla.spmd=true"]}, "unknown config key 'xla' (from override); valid keys here: backend"),
        ({"overrides": ["seed"]}, "override 'seed' is not key=value"),
    ],
)
def test_errors_are_one_line_naming_key_value_and_choices(kw, expected):
    with pytest.raises(ConfigError) as info:
        _resolve(**kw)
    msg = info.value.one_line()
    assert "\n" not in msg
    assert msg.startswith(expected), msg


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        _resolve(config_file=str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML at line"):
        _resolve(config_file=str(bad))
    listy = tmp_path / "list.yaml"
    listy.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        _resolve(config_file=str(listy))


def test_plugin_sections_validate_with_the_rest(tmp_path):
    cfg = _resolve(sections=SECTIONS, overrides=["widget.depth=5"], environ={"AIOS_WIDGET__MODE": "slow"})
    assert cfg.widget.depth == 5 and cfg.widget.mode == "slow"
    with pytest.raises(ConfigError, match="unknown config key 'widget.colour'"):
        _resolve(sections=SECTIONS, overrides=["widget.colour=red"])
    with pytest.raises(ConfigError, match="invalid value 'deep' for 'widget.depth'"):
        _resolve(sections=SECTIONS, overrides=["widget.depth=deep"])


def test_precision_aliases():
    assert _resolve(overrides=["precision=bf16"]).precision == "bf16-mixed"
    assert _resolve(overrides=["precision=32"]).precision == "fp32"


def test_backend_checked_against_installed_plugins():
    with pytest.raises(ConfigError, match="invalid value 'tpu' for 'backend' .*choose one of: auto, cpu"):
        resolve(overrides=["backend=tpu"], environ={}, check_backend=True)
    # a first-party backend that is not installed is accepted here; selection reports the install line
    assert resolve(overrides=["backend=xla"], environ={}, check_backend=True).backend == "xla"


def test_override_values_are_yaml_scalars():
    assert parse_overrides(["a.b=true", "c=1e-3", "d=null", "e=[1, 2]", "f=text"]) == {
        "a": {"b": True}, "c": 1e-3, "d": None, "e": [1, 2], "f": "text"}


def test_redaction_of_secret_looking_keys():
    data = {"wandb_api_key": "abc", "nested": {"aws_secret_access_key": "s", "token": ""}, "name": "ok"}
    assert redact(data) == {"wandb_api_key": "***", "nested": {"aws_secret_access_key": "***", "token": ""}, "name": "ok"}
