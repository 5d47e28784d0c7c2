def test_the_reserved_config_keys_are_the_core_config_fields():
    """The plugin registry refuses plugin sections named like a core key without importing the
    config: its list (aios.plugins.reserved.CONFIG_KEYS) must be exactly core's fields."""
    from aios.config.settings import AiosConfigBase
    from aios.plugins.reserved import CONFIG_KEYS

    assert set(AiosConfigBase.model_fields) == CONFIG_KEYS
