"""The sections of the config: every field in one, each with a docstring; the generated reference doc."""

from __future__ import annotations

import re

import pytest

from realtime_gw.config import FIELDS
from realtime_gw.config.reference import markdown
from realtime_gw.config.sections import BY_NAME, SECTION_OF, SECTIONS, field_docs, fields_under
from tests.conftest import ROOT


def test_every_field_belongs_to_exactly_one_section() -> None:
    listed = [f for s in SECTIONS for f in s.fields]
    assert sorted(listed) == sorted(FIELDS)  # each once, none left out
    assert set(SECTION_OF) == set(FIELDS)
    assert len(BY_NAME) == len(SECTIONS)
    for s in SECTIONS:
        assert "." not in s.name or s.name.rsplit(".", 1)[0] in BY_NAME, f"{s.name} has no parent section"


def test_keys_are_unique_within_a_table_and_never_a_subtable() -> None:
    for s in SECTIONS:
        keys = list(s.keys.values())
        assert len(keys) == len(set(keys)), s.name
        subtables = {t.name.rsplit(".", 1)[1] for t in SECTIONS if t.name.startswith(s.name + ".")}
        assert not subtables & set(keys), s.name


def test_a_table_key_is_the_field_name_less_its_section_prefix_unless_renamed() -> None:
    assert BY_NAME["tts"].keys["tts_device"] == "device"
    assert BY_NAME["tts.qwen3"].keys["tts_compile"] == "compile"
    assert BY_NAME["tts"].keys["tts"] == "family"
    assert BY_NAME["workers"].keys["worker_max_active"] == "max_active"
    assert BY_NAME["limits"].keys["max_sessions"] == "max_sessions"


def test_every_field_has_a_docstring_without_measurement_history() -> None:
    docs = field_docs()
    assert set(docs) == set(FIELDS)
    history = re.compile(r"H100|H200|A100|[Mm]easured|\bp9[59]\b|\bsession \d|\bissue \d")
    for name, doc in docs.items():
        assert doc.strip(), name
        assert not history.search(doc), f"{name}: numbers of a run belong in docs/benchmarks.md: {doc}"
    for s in SECTIONS:
        assert s.doc, s.name


def test_a_path_names_a_section_with_its_subsections_or_one_setting() -> None:
    tts = fields_under("tts")
    assert {"tts", "tts_device", "tts_deterministic", "tts_compile"} <= set(tts)
    assert fields_under("tts.qwen3") == BY_NAME["tts.qwen3"].fields
    assert fields_under("openpi.max_sessions") == ("openpi_max_sessions",)
    with pytest.raises(KeyError, match="nothing"):
        fields_under("tts.nothing")


def test_the_configuration_doc_is_current() -> None:
    """Regenerate with: python -m realtime_gw.config.reference > docs/configuration.md"""
    assert (ROOT / "docs" / "configuration.md").read_text() == markdown()
