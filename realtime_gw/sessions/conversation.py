"""The conversation: ordered items, plus what the gateway needs to know to truncate assistant audio
and which user transcripts are still on their way. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field

from realtime_gw.protocols import realtime as rt
from realtime_gw.protocols.realtime import ContentPart, Item
from realtime_gw.records.voice import ChatMessage


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

    def truncate(self, audio_end_ms: float) -> None:
        """Keep only the audio before ``audio_end_ms`` and the words heard in it."""
        part = next(c for c in self.item.content if c.type == "output_audio")
        part.transcript = heard_text(self.spans, self.audio_ms, audio_end_ms)
        self.audio_ms = audio_end_ms
        self.spans = [s for s in self.spans if s.start_ms < audio_end_ms]


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
        self._transcribing: set[str] = set()
        """User audio items whose transcript has not arrived yet: a response waits for them."""

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

    @property
    def full(self) -> bool:
        return len(self._order) >= self.max_items

    @property
    def transcripts_pending(self) -> bool:
        return bool(self._transcribing)

    def check_add(self, item_id: str) -> None:
        """Raise what ``add`` would raise for a new item ``item_id`` (checked before anything changes)."""
        if self.full:
            raise ConversationError(
                f"Conversation is full ({self.max_items} items); delete items first", "conversation_full"
            )
        if item_id in self._entries:
            raise ConversationError(f"Item '{item_id}' already exists", "item_exists", "item.id")

    def add(self, item: Item, previous_item_id: str | None = None, transcribing: bool = False) -> Entry:
        """Insert ``item``; ``transcribing``: its transcript is still to come (``fill_transcript``)."""
        assert item.id is not None
        self.check_add(item.id)
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
        if transcribing:
            self._transcribing.add(item.id)
        return entry

    def delete(self, item_id: str) -> None:
        self.get(item_id)
        del self._entries[item_id]
        self._order.remove(item_id)
        self._transcribing.discard(item_id)

    def fill_transcript(self, item_id: str, text: str | None, error: str | None) -> ContentPart | None:
        """A user transcript arrived (or failed): fill the item's audio part. None if the item is gone."""
        self._transcribing.discard(item_id)
        entry = self._entries.get(item_id)
        if entry is None:
            return None
        part = next(c for c in entry.item.content if c.type == "input_audio")
        if error is None:
            part.transcript = text or ""
        return part

    def entries(self) -> list[Entry]:
        return [self._entries[i] for i in self._order]

    def as_chat(self) -> list[ChatMessage]:
        """The conversation as a responder reads it: messages with text (or transcripts), in order."""
        msgs: list[ChatMessage] = []
        for entry in self.entries():
            text = item_text(entry.item)
            if text and entry.item.role is not None and entry.item.type == "message":
                msgs.append(ChatMessage(entry.item.role, text))
        return msgs


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


_ALLOWED_PARTS = {
    "user": {"input_text", "input_audio"},
    "system": {"input_text"},
    "assistant": {"output_text", "output_audio", "text", "audio"},
}


def check_message(item: Item) -> None:
    """A client's ``conversation.item.create`` item: a message whose parts fit its role."""
    if item.type != "message":
        raise ConversationError(
            f"Item type '{item.type}' is not supported (no tools are configured); send a message",
            "invalid_value",
            "item.type",
        )
    if item.role is None:
        raise ConversationError("A message item needs a role", "missing_required_parameter", "item.role")
    allowed = _ALLOWED_PARTS[item.role]
    for i, part in enumerate(item.content):
        if part.type not in allowed:
            raise ConversationError(
                f"Content type '{part.type}' is not valid for a {item.role} message",
                "invalid_value",
                f"item.content[{i}].type",
            )


def transcription_events(item_id: str, part: ContentPart, error: str | None) -> list[rt.ServerEvent]:
    """What the client hears about a user transcript (when it asked for transcription)."""
    if error is not None:
        failure = rt.TranscriptionError(code="transcription_failed", message=error)
        return [rt.ConversationItemInputAudioTranscriptionFailedEvent(item_id=item_id, content_index=0, error=failure)]
    text = part.transcript or ""
    return [
        rt.ConversationItemInputAudioTranscriptionDeltaEvent(item_id=item_id, content_index=0, delta=text),
        rt.ConversationItemInputAudioTranscriptionCompletedEvent(
            item_id=item_id, content_index=0, transcript=text, usage=rt.TranscriptionUsage(seconds=0.0)
        ),
    ]
