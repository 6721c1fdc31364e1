"""One config for the whole gateway: defaults < TOML file < environment < CLI flags.

``GatewayConfig`` holds every setting flat (``config.tts_device``); each field belongs to one section
(``config.gateway``), which is how ``serve --help``, TOML files and ``config --show`` present it
(``config.sections``, ``config.files``). Environment variables are ``REALTIME_GW_<FIELD>``.
"""

from realtime_gw.config.files import ENV_PREFIX, FIELDS, SettingsFileError, load_config, to_toml
from realtime_gw.config.gateway import SECRETS, TTS_SHAPES, ConfigError, GatewayConfig

__all__ = [
    "ENV_PREFIX",
    "FIELDS",
    "SECRETS",
    "TTS_SHAPES",
    "ConfigError",
    "GatewayConfig",
    "SettingsFileError",
    "load_config",
    "to_toml",
]
