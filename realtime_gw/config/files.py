"""Loading the config (defaults < TOML file < environment < explicit overrides) and writing it back as
sectioned TOML.

A TOML file may be written in sections (``[tts]`` ``device = "cuda"``, ``[tts.qwen3]`` ``compile = true``)
or with the flat field names at the top level (``tts_device = "cuda"``), or both; a key that names no
setting, or a setting in the wrong table, is refused with its name and where it belongs.
Environment variables are ``REALTIME_GW_<FIELD>`` (upper case), e.g. ``REALTIME_GW_PORT=9000``.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from realtime_gw.config.gateway import SECRETS, ConfigError, GatewayConfig
from realtime_gw.config.sections import BY_NAME, SECTION_OF, SECTIONS, Section, field_docs, plain

ENV_PREFIX = "REALTIME_GW_"
FIELDS = {f.name: f for f in msgspec.structs.fields(GatewayConfig)}


class SettingsFileError(ConfigError, msgspec.ValidationError):
    """A config file's key that names no setting, or names one in the wrong table."""


def _where(field: str) -> str:
    section = SECTION_OF[field]
    return f"[{section.name}] {section.keys[field]}"


def flatten(doc: Mapping[str, Any], source: str = "config") -> dict[str, Any]:
    """A decoded TOML document, sectioned or flat, as ``{field: value}``."""
    out: dict[str, Any] = {}

    def put(field: str, value: Any, written: str) -> None:
        if field in out:
            raise SettingsFileError(f"{source}: {field} is set twice (the second time as {written})")
        out[field] = value

    def table(section: Section, items: Mapping[str, Any]) -> None:
        by_key = {k: f for f, k in section.keys.items()}
        for key, value in items.items():
            written = f"[{section.name}] {key}"
            sub = BY_NAME.get(f"{section.name}.{key}")
            if sub is not None and isinstance(value, Mapping):
                table(sub, value)
            elif key in by_key:
                put(by_key[key], value, written)
            else:
                raise SettingsFileError(f"{source}: {written} is {_misplaced(key, section)}")

    for key, value in doc.items():
        if key in BY_NAME and isinstance(value, Mapping):
            table(BY_NAME[key], value)
        elif key in FIELDS:
            put(key, value, key)
        else:
            raise SettingsFileError(f"{source}: {key} is {_misplaced(key, None)}")
    return out


REMOVED = {
    "max_client_secrets": "no longer a setting: client secrets are sealed, not stored; delete it",
    "webrtc_max_client_secrets": "no longer a setting: client secrets are sealed, not stored; delete it",
}
"""Settings an earlier release had: a file that still sets one is told what became of it."""


def _misplaced(key: str, section: Section | None) -> str:
    """Why ``key`` is refused where it is, and where it may be meant."""
    if key in REMOVED:
        return REMOVED[key]
    if key in FIELDS:
        return f"a flat name: write it at the top level, or as {_where(key)}"
    if section is None and key in BY_NAME:
        return "a section: write it as a table ([name])"
    homes = [f"[{s.name}] {key}" for s in SECTIONS if key in s.keys.values()]
    if homes:
        return f"not a setting of this table; did you mean {' or '.join(homes)}?"
    return "not a setting (realtime-gw serve --help lists them)"


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in FIELDS:
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is None:
            continue
        # Lists come as JSON ("[-2,-1,0]"); everything else is converted from the string.
        out[name] = msgspec.json.decode(raw) if raw.startswith("[") else raw
    return out


def load_config(
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> GatewayConfig:
    """Merge defaults, a TOML file, ``REALTIME_GW_*`` variables and explicit overrides, in that order."""
    merged: dict[str, Any] = {}
    if path is not None:
        merged.update(flatten(msgspec.toml.decode(Path(path).read_bytes()), str(path)))
    merged.update(_from_env(os.environ if env is None else env))
    merged.update({k: v for k, v in (overrides or {}).items() if v is not None})
    # strict=False lets "9000" (env) become 9000 and "true" become True.
    return msgspec.convert(merged, GatewayConfig, strict=False)


# -- writing -----------------------------------------------------------------------------------------------
def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return msgspec.json.encode(value).decode()  # JSON's string escapes are TOML basic-string escapes
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def _comment(text: str, indent: str = "") -> list[str]:
    return [indent + "# " + line for line in textwrap.wrap(plain(text), 100)]


def to_toml(config: GatewayConfig, secrets: bool = False) -> str:
    """Every setting of ``config`` as sectioned TOML, each under its docstring; ``load_config`` reads it
    back to the same config. Unset (None) settings are shown commented out; so are credentials, unless
    ``secrets``."""
    docs = field_docs()
    lines = [
        "# realtime-gw configuration: every setting, in its section. A file may set any subset;",
        "# the flat field names (tts_device = ...) are accepted at the top level too.",
    ]
    for section in SECTIONS:
        lines += ["", *_comment(section.doc), f"[{section.name}]"]
        for field in section.fields:
            value = getattr(config, field)
            key = section.keys[field]
            lines += _comment(docs.get(field, ""))
            if field in SECRETS and value and not secrets:
                lines.append(f"# {key} = (set, not shown; --secrets shows it)")
            elif value is None:
                lines.append(f"# {key} = (unset)")
            else:
                lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"
