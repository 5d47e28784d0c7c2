"""Core's strategy contract kit (aios.testing.strategy_contract) run against the Neuron-XLA
strategy (``NeuronXlaStrategy``: backend-xla's step semantics under ``--backend neuron``) on the
real torch_xla, XLA:CPU standing in for the Neuron PJRT device (opt-in
``AIOS_TEST_NEURON_ON_XLA_CPU=1``; discovery reads a recorded trn1.2xlarge ``neuron-ls``)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from aios.testing.strategy_contract import StrategyContract

pytestmark = [pytest.mark.xla, pytest.mark.slow]


class TestNeuronXlaStrategyContract(StrategyContract):
    backend = "neuron"
    strategy = "ddp"
    nprocs = 1
    env = {"AIOS_TEST_NEURON_ON_XLA_CPU": "1", "AIOS_TEST_DMI_PRODUCT": "/nonexistent"}
    timeout = 900

    @pytest.fixture(autouse=True)
    def _trn1(self, fake_neuron_ls):
        fake_neuron_ls("trn1.2xlarge")
