"""docs/configuration.md, written from the sections and the fields' docstrings:
``python -m realtime_gw.config.reference > docs/configuration.md`` (a test checks the file is current)."""

from __future__ import annotations

import msgspec

from realtime_gw.config.files import FIELDS
from realtime_gw.config.gateway import GatewayConfig
from realtime_gw.config.sections import SECTIONS, field_docs, plain


def markdown() -> str:
    """docs/configuration.md: every section and setting, from the fields and their docstrings
    (``python -m realtime_gw.config.reference > docs/configuration.md``; a test checks it is current)."""
    defaults = GatewayConfig()
    out = [
        "# Configuration",
        "",
        "<!-- Written by `python -m realtime_gw.config.reference > docs/configuration.md`; do not edit. -->",
        "",
        "Every setting can be given four ways; later ones win: its default, a TOML file (`realtime-gw serve",
        "--config gw.toml`), an environment variable `REALTIME_GW_<FIELD>` (`REALTIME_GW_TTS_DEVICE=cuda`;",
        'lists as JSON, `\'["a", "b"]\'`), and a flag of `realtime-gw serve` (`--tts-device cuda`).',
        "`realtime-gw serve --help` lists the flags in these sections;",
        "`realtime-gw config --show [--config FILE] [flags]` prints the settings the gateway would run with,",
        "as a TOML file that `--config` reads back.",
        "",
        "In a TOML file a setting is written in its section, or at the top level under its flat field",
        "name (the flag's name with `_`); both may be mixed:",
        "",
        "```toml",
        'tts_voice = "vivian"   # flat',
        "",
        "[tts]",
        'family = "qwen3"       # = tts',
        'device = "cuda"        # = tts_device',
        "",
        "[tts.qwen3]",
        "compile = true         # = tts_compile",
        "```",
        "",
        "A key that names no setting, or a setting in another section, is refused with its name and where",
        "it belongs. Unset settings (no value) are left out of a file.",
    ]
    docs = field_docs()
    for section in SECTIONS:
        out += [
            "",
            f"## [{section.name}]",
            "",
            section.doc,
            "",
            "| key | field, flag | default | what it does |",
            "|---|---|---|---|",
        ]
        for field in section.fields:
            value = getattr(defaults, field)
            shown = "unset" if value is None else msgspec.json.encode(value).decode()
            flag = "--" + field.replace("_", "-")
            text = plain(docs.get(field, "")).replace("|", "\\|")
            out.append(f"| `{section.keys[field]}` | `{field}` `{flag}` | `{shown}` | {text} |")
    assert sum(len(s.fields) for s in SECTIONS) == len(FIELDS)
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
