"""Plugin commands (``aios_register_commands``): listed by ``aios --help`` from their specs,
imported only when run; a broken plugin is named, never fatal; without aios-cloud, ``aios launch``
says how to install it from the checkout."""

from __future__ import annotations

GOOD = """
    from aios import hookimpl
    from aios.types import CommandSpec

    @hookimpl
    def aios_register_commands(register):
        register(CommandSpec(name="hello", target="hello_cmds:hello", help="Say hello."))
        register(CommandSpec(name="broken", target="hello_missing:cmd", help="Cannot import."))
"""

CMDS = """
    import click

    @click.command("hello")
    @click.argument("who")
    def hello(who):
        click.echo(f"hello {who}")
"""

CLAIMS_RUN = """
    from aios import hookimpl
    from aios.types import CommandSpec

    @hookimpl
    def aios_register_commands(register):
        register(CommandSpec(name="run", target="x:y", help="Steal run."))
        register(CommandSpec(name="bad target", target="nocolon", help="?"))
"""


def _cmds_plugin(site, write_dist):
    write_dist(site, "aios-hello", "hello_plugin", GOOD)
    (site / "hello_cmds.py").write_text(CMDS.replace("\n    ", "\n"))


def test_plugin_command_listed_by_help_and_run_lazily(site, write_dist, run_aios):
    _cmds_plugin(site, write_dist)
    env = {"AIOS_PLUGINS": "aios-hello"}
    res = run_aios("--help", env=env)
    assert res.returncode == 0, res.stderr
    assert "Commands from aios-hello:" in res.stdout
    assert "hello   Say hello." in res.stdout or "hello  Say hello." in res.stdout
    assert "run " in res.stdout  # the core commands stay
    ok = run_aios("hello", "world", env=env)
    assert ok.returncode == 0 and ok.stdout.strip() == "hello world", ok.stderr


def test_command_that_fails_to_import_is_named_and_not_fatal(site, write_dist, run_aios):
    _cmds_plugin(site, write_dist)
    env = {"AIOS_PLUGINS": "aios-hello"}
    res = run_aios("broken", "--some-flag", "x", env=env)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr
    assert "command 'broken' of plugin \"aios-hello\" failed to load" in lines[0]
    assert "ModuleNotFoundError" in lines[0]
    # the other commands still work
    assert run_aios("hello", "again", env=env).stdout.strip() == "hello again"
    assert run_aios("config", "show", env=env).returncode == 0


def test_plugin_that_fails_to_import_is_named_by_help_and_unknown_commands(
    site, write_dist, run_aios
):
    write_dist(site, "aios-crash", "crash_plugin", "raise RuntimeError('boom')\n")
    env = {"AIOS_PLUGINS": "aios-crash"}
    res = run_aios("--help", env=env)
    assert res.returncode == 0, res.stderr
    assert "aios-crash" in res.stdout and "failed to load" in res.stdout
    unknown = run_aios("frobnicate", env=env)
    assert unknown.returncode == 2
    assert "no such command 'frobnicate'" in unknown.stderr and "aios-crash" in unknown.stderr
    assert "Traceback" not in unknown.stderr


def test_core_command_names_cannot_be_taken(site, write_dist, run_aios):
    write_dist(site, "aios-thief", "thief_plugin", CLAIMS_RUN)
    env = {"AIOS_PLUGINS": "aios-thief"}
    res = run_aios("plugins", "--json", env=env)
    assert res.returncode == 0, res.stderr
    assert "command 'run' is built into aios" in res.stdout
    assert "'bad target'" in res.stdout or "bad target" in res.stdout
    assert run_aios("run", "--help", env=env).stdout.startswith("Usage: aios run")


def test_cloud_command_without_aios_cloud_says_how_to_install_it(run_aios):
    env = {"AIOS_DISABLE_PLUGINS": "aios-cloud"}
    res = run_aios("launch", "--cloud", "gcp", "train.py", env=env)
    assert res.returncode == 2
    line = res.stderr.strip()
    assert len(line.splitlines()) == 1, line
    assert "aios-cloud package is not installed" in line
    assert "pip install -e ./packages/core ./packages/cloud" in line and "checkout" in line
    assert "pip install aios" not in line  # never from the public registry
    help_ = run_aios("--help", env=env)
    assert "./packages/cloud" in help_.stdout


def test_allow_list_brings_the_plugins_a_plugin_depends_on(site, write_dist, run_aios):
    """AIOS_PLUGINS=aios-cloud-gcp also loads aios-cloud (its dependency): here a fake plugin
    requiring the fake command plugin."""
    _cmds_plugin(site, write_dist)
    write_dist(site, "aios-child", "child_plugin", "x = 1\n")
    meta = next(site.glob("aios_child-*.dist-info")) / "METADATA"
    meta.write_text(
        meta.read_text()
        + "Requires-Dist: aios-hello>=1.0\nRequires-Dist: pytest; extra == 'test'\n"
    )
    ok = run_aios("hello", "dep", env={"AIOS_PLUGINS": "aios-child"})
    assert ok.returncode == 0 and ok.stdout.strip() == "hello dep", ok.stderr
    # without the dependency link the allow list keeps it out
    assert run_aios("hello", "dep", env={"AIOS_PLUGINS": "aios-core"}).returncode == 2
