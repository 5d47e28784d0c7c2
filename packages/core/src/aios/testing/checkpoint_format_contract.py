"""A contract kit for checkpoint formats (the ``aios_register_checkpoint_formats`` hook): subclass
:class:`CheckpointFormatContract` in a test module to prove a format, first-party or
third-party, through the registry the way a run finds it.

    from aios.testing.checkpoint_format_contract import CheckpointFormatContract

    class TestMyFormat(CheckpointFormatContract):
        format_name = "my-format"        # what the plugin registers
        plugin = "my-plugin"             # its entry-point name

What it checks, in one process (a 1-rank run on the CPU):

* the registry (loaded from the installed entry points) has the format under its name,
  registered by ``plugin``, and its ``factory()`` builds a fresh
  :class:`~aios.checkpoint.formats.base.CheckpointFormat` whose ``name`` is the registered one, with
  ``all_ranks_write`` and ``supports_resharding`` declared as booleans;
* a real run (``aios.init`` with ``checkpoint.dir``) saving with the format writes a committed
  checkpoint whose marker names the format, and a resume reads it back through the registry
  (not through the instance that wrote it): the step and every parameter come back exactly.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, ClassVar

import pytest

import aios
from aios.checkpoint.formats.base import CheckpointFormat
from aios.plugins.registry import get_registry, reset_registry

#: the checkpoint's marker file (what a committed checkpoint carries)
MARKER = "aios-checkpoint.json"


class CheckpointFormatContract:
    """Subclass it and name :attr:`format_name` and :attr:`plugin` (see the module)."""

    #: the name the format is registered under
    format_name: ClassVar[str] = ""
    #: the entry-point name of the plugin that registers it
    plugin: ClassVar[str] = ""

    @pytest.fixture
    def clean_run(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
        """A fresh registry and a 1-rank CPU run's environment; the run is closed after."""
        for k in [k for k in os.environ if k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK"))]:
            monkeypatch.delenv(k)
        monkeypatch.setenv("AIOS_LOGGING__TENSORBOARD", "false")
        monkeypatch.chdir(tmp_path)
        reset_registry()
        yield tmp_path

        rt = aios.current()
        if rt is not None:
            rt.close()
        reset_registry()

    def test_the_format_is_registered_through_the_hook(self, clean_run: Path) -> None:
        formats = get_registry().checkpoint_formats
        assert self.format_name in formats, sorted(formats)
        spec = formats[self.format_name]
        assert spec.plugin == self.plugin
        one, two = spec.factory(), spec.factory()
        assert isinstance(one, CheckpointFormat) and one is not two
        assert one.name == self.format_name
        assert isinstance(one.all_ranks_write, bool)
        assert isinstance(one.supports_resharding, bool)

    def test_a_run_saves_with_it_and_resumes_exactly(self, clean_run: Path) -> None:
        import torch

        ck = clean_run / "ck"
        rt = aios.init(
            checkpoint={"dir": str(ck)}, logging={"run_dir": str(clean_run / "runs")}, seed=3
        )
        fmt = get_registry().checkpoint_formats[self.format_name].factory()
        rt.checkpointer.format = fmt
        model = rt.setup(torch.nn.Linear(4, 2))
        rt.training.step = 5
        path = rt.save()
        marker = json.loads(Path(path, MARKER).read_text())
        assert marker["checkpoint_format"] == self.format_name
        want = {k: v.detach().clone() for k, v in model.state_dict().items()}
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
        rt.training.step = 0
        rt.checkpointer.format = get_registry().checkpoint_formats["full"].factory()
        assert rt.resume() == 5  # read by the format the marker names, built from the registry
        got = model.state_dict()
        assert all(torch.equal(got[k], v) for k, v in want.items())


__all__ = ["CheckpointFormatContract"]
