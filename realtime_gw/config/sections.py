"""The sections of ``GatewayConfig`` as users see them: names, keys, and the fields' own docstrings.

The sections are read off the struct classes in ``config.front`` and ``config.gateway`` (each declares its ``SECTION``), so
this table cannot drift from the fields. Docstrings are read from that module's source, since Python
keeps no attribute docstrings at run time.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import msgspec

from realtime_gw.config.gateway import GatewayConfig


@dataclass(frozen=True)
class Section:
    name: str
    """Dotted TOML table name: ``tts``, ``tts.qwen3``."""
    doc: str
    """What the section is for (its class docstring)."""
    fields: tuple[str, ...]
    """Its fields (flat names), in declaration order."""
    keys: dict[str, str]
    """Field -> its key in the TOML table."""

    @property
    def prefix(self) -> str:
        """What a field name loses to become its key: a subsection's fields share their root's prefix."""
        return self.name.split(".")[0] + "_"


def _sections() -> tuple[Section, ...]:
    out: list[Section] = []
    seen: set[str] = set()
    for cls in reversed(GatewayConfig.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, msgspec.Struct)) or "SECTION" not in cls.__dict__:
            continue
        own = tuple(f.name for f in msgspec.structs.fields(cls) if f.name not in seen)
        seen.update(own)
        name: str = cls.__dict__["SECTION"]
        renames: dict[str, str] = cls.__dict__.get("KEYS", {})
        prefix = name.split(".")[0] + "_"
        keys = {f: renames.get(f, f.removeprefix(prefix)) for f in own}
        out.append(Section(name, " ".join((cls.__doc__ or "").split()), own, keys))
    return tuple(out)


SECTIONS: tuple[Section, ...] = _sections()
BY_NAME: dict[str, Section] = {s.name: s for s in SECTIONS}
SECTION_OF: dict[str, Section] = {f: s for s in SECTIONS for f in s.fields}
"""Field -> the one section it belongs to."""


def fields_under(path: str) -> tuple[str, ...]:
    """The fields a dotted path names: a section with its subsections (``tts``: also ``tts.qwen3``'s),
    or one field (``openpi.max_sessions``)."""
    if path in BY_NAME:
        return tuple(f for s in SECTIONS if s.name == path or s.name.startswith(path + ".") for f in s.fields)
    table, _, key = path.rpartition(".")
    section = BY_NAME.get(table)
    found = [f for f, k in section.keys.items() if k == key] if section else []
    if not found:
        raise KeyError(f"no section or setting {path!r}")
    return (found[0],)


@functools.cache
def field_docs() -> dict[str, str]:
    """Field -> its docstring, as written (the string literal under the field in its section's module,
    ``config.front`` or ``config.gateway``)."""
    modules = {sys.modules[c.__module__] for c in GatewayConfig.__mro__ if c.__module__.startswith(__package__)}
    docs: dict[str, str] = {}
    classes = [
        node
        for module in sorted(modules, key=lambda m: m.__name__)
        for node in ast.parse(Path(module.__file__ or "").read_text(encoding="utf-8")).body
    ]
    for cls in classes:
        if not isinstance(cls, ast.ClassDef):
            continue
        for stmt, after in zip(cls.body, cls.body[1:], strict=False):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[stmt.target.id] = after.value.value
    return docs


def plain(doc: str) -> str:
    """A docstring as one line of plain text: whitespace collapsed, reST/Markdown backticks dropped."""
    return re.sub(r"``?([^`]+)``?", r"\1", " ".join(doc.split()))
