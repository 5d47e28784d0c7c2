"""Core's own checkpoint formats, registered through ``aios_register_checkpoint_formats`` in
:mod:`aios.plugins.builtin`, pass the checkpoint-format contract kit."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from aios.testing.checkpoint_format_contract import CheckpointFormatContract


class TestFullFormat(CheckpointFormatContract):
    format_name = "full"
    plugin = "aios-core"


class TestDcpFormat(CheckpointFormatContract):
    format_name = "dcp"
    plugin = "aios-core"
