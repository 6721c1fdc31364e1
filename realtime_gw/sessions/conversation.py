"""The conversation: ordered items, plus what the gateway needs to know to truncate assistant audio."""

from __future__ import annotations

from dataclasses import dataclass, field

from realtime_gw.protocols.realtime import ContentPart, Item


class ConversationError(ValueError):
    def __init__(self, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.param = param


@dataclass(slots=True)
class SpokenSpan:
    """A piece of assistant text and where its audio starts in the item's audio."""

    start_ms: float
    text: str


@dataclass(slots=True)
class Entry:
    item: Item
    audio_ms: float = 0.0
    spans: list[SpokenSpan] = field(default_factory=list)
    transcript_pending: bool = False


def heard_text(spans: list[SpokenSpan], total_ms: float, audio_end_ms: float) -> str:
    """The words heard before ``audio_end_ms``: whole spans, plus the same share of the words of the
    span being spoken as of its audio (word timings are not known, so this is proportional)."""
    words: list[str] = []
    for i, span in enumerate(spans):
        if span.start_ms >= audio_end_ms:
            break
        end = spans[i + 1].start_ms if i + 1 < len(spans) else total_ms
        span_words = span.text.split()
        if audio_end_ms >= end:
            words += span_words
        else:
            share = (audio_end_ms - span.start_ms) / max(end - span.start_ms, 1e-6)
            words += span_words[: int(share * len(span_words))]
    return " ".join(words)


class Conversation:
    def __init__(self, max_items: int) -> None:
        self.max_items = max_items
        self._entries: dict[str, Entry] = {}
        self._order: list[str] = []

    def __contains__(self, item_id: str) -> bool:
        return item_id in self._entries

    def __len__(self) -> int:
        return len(self._order)

    def get(self, item_id: str) -> Entry:
        entry = self._entries.get(item_id)
        if entry is None:
            raise ConversationError(f"Item '{item_id}' does not exist", "item_not_found", "item_id")
        return entry

    def last_id(self) -> str | None:
        return self._order[-1] if self._order else None

    def previous_id(self, item_id: str) -> str | None:
        i = self._order.index(item_id)
        return self._order[i - 1] if i > 0 else None

    def add(self, item: Item, previous_item_id: str | None = None) -> Entry:
        assert item.id is not None
        if len(self._order) >= self.max_items:
            raise ConversationError(
                f"Conversation is full ({self.max_items} items); delete items first", "conversation_full"
            )
        if item.id in self._entries:
            raise ConversationError(f"Item '{item.id}' already exists", "item_exists", "item.id")
        if previous_item_id is None:
            index = len(self._order)
        elif previous_item_id == "root":
            index = 0
        elif previous_item_id in self._entries:
            index = self._order.index(previous_item_id) + 1
        else:
            raise ConversationError(
                f"previous_item_id '{previous_item_id}' does not exist", "item_not_found", "previous_item_id"
            )
        entry = Entry(item)
        self._entries[item.id] = entry
        self._order.insert(index, item.id)
        return entry

    def delete(self, item_id: str) -> None:
        self.get(item_id)
        del self._entries[item_id]
        self._order.remove(item_id)

    def entries(self) -> list[Entry]:
        return [self._entries[i] for i in self._order]


def item_text(item: Item) -> str:
    """What an item says, for a text responder: text parts, else transcripts."""
    parts: list[str] = []
    for c in item.content:
        if c.text:
            parts.append(c.text)
        elif c.transcript:
            parts.append(c.transcript)
    return " ".join(parts)


def assistant_part(entry: Entry, content_index: int) -> ContentPart:
    if entry.item.role != "assistant":
        raise ConversationError(
            f"Item '{entry.item.id}' is a {entry.item.role} item; only assistant audio can be truncated",
            "invalid_item",
            "item_id",
        )
    if not 0 <= content_index < len(entry.item.content) or entry.item.content[content_index].type != "output_audio":
        raise ConversationError(
            f"content_index {content_index} is not an audio part of item '{entry.item.id}'",
            "invalid_content_index",
            "content_index",
        )
    return entry.item.content[content_index]
