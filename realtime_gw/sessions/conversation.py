"""The conversation: ordered items (messages, function calls and their outputs), plus what the gateway
needs to know to truncate assistant audio and which user transcripts are still on their way. Pure.

What the model is sent of it is ``sessions/context.py``'s business."""

from __future__ import annotations

from dataclasses import dataclass, field

from realtime_gw.protocols import realtime as rt
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
    """Assistant audio the server generated for the item (after any truncation: what was kept)."""
    spans: list[SpokenSpan] = field(default_factory=list)
    response_id: str | None = None
    """The response that produced it (its message and function calls go to the model together)."""
    input_seconds: float = 0.0
    """User audio committed for it (transcription ``usage.seconds``)."""
    generated_ms: float = 0.0
    """All audio the server generated for the item; a client truncate may cut anywhere up to it."""

    def truncate(self, audio_end_ms: float) -> None:
        """Keep the audio before ``audio_end_ms`` and the words heard in it. Cuts are always measured
        against everything generated, so a later cut (the client's own) may also move the end back
        out again, up to what was generated: the last cut is the final word."""
        part = next((c for c in self.item.content if c.type == "output_audio"), None)
        if part is None:
            return
        self.generated_ms = max(self.generated_ms, self.audio_ms)
        audio_end_ms = min(audio_end_ms, self.generated_ms)
        part.transcript = heard_text(self.spans, self.generated_ms, audio_end_ms)
        self.audio_ms = audio_end_ms


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
    def __init__(self, max_items: int, max_retained: int | None = None) -> None:
        self.max_items = max_items
        self.max_retained = max_retained or max_items
        """With truncation on, the oldest items past this many are forgotten (``forget_oldest``)."""
        self.bounded = True
        """``truncation: "disabled"``: past ``max_items`` an add is refused ``conversation_full``;
        otherwise the oldest items are forgotten to make room."""
        self._entries: dict[str, Entry] = {}
        self._order: list[str] = []
        self._transcribing: set[str] = set()
        """User audio items whose transcript has not arrived yet: a response waits for them."""

    def __contains__(self, item_id: str) -> bool:
        return item_id in self._entries

    def __len__(self) -> int:
        return len(self._order)

    def get(self, item_id: str, code: str = "item_not_found") -> Entry:
        """The item, or ``ConversationError(code)`` (OpenAI names it per event: ``item_retrieve_…``,
        ``item_truncate_…``, ``item_delete_invalid_item_id``; clients match on those)."""
        entry = self._entries.get(item_id)
        if entry is None:
            raise ConversationError(f"Item with item_id '{item_id}' not found", code, "item_id")
        return entry

    def last_id(self) -> str | None:
        return self._order[-1] if self._order else None

    def previous_id(self, item_id: str) -> str | None:
        i = self._order.index(item_id)
        return self._order[i - 1] if i > 0 else None

    @property
    def full(self) -> bool:
        return self.bounded and len(self._order) >= self.max_items

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

    def add(
        self, item: Item, previous_item_id: str | None = None, transcribing: bool = False, force: bool = False
    ) -> Entry:
        """Insert ``item``; ``transcribing``: its transcript is still to come (``fill_transcript``);
        ``force``: an output item of a response that was admitted (its room was checked at create)."""
        assert item.id is not None
        if not force:
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
        if not self.bounded:
            self.forget_oldest(self.max_retained, keep=item.id)
        return entry

    def forget_oldest(self, limit: int, keep: str | None = None) -> list[str]:
        """Drop the oldest items past ``limit`` from memory, silently: the client keeps its own view
        (and can no longer retrieve them). Returns their ids."""
        gone: list[str] = []
        while len(self._order) > limit and self._order[0] != keep:
            item_id = self._order[0]
            self.delete(item_id)
            gone.append(item_id)
        return gone

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


def item_text(item: Item) -> str:
    """What an item says, for a text responder: text parts, else transcripts."""
    parts: list[str] = []
    for c in item.content:
        if c.text:
            parts.append(c.text)
        elif c.transcript:
            parts.append(c.transcript)
    return " ".join(parts)


def assistant_audio(entry: Entry) -> ContentPart:
    """The audio part of an assistant item (a truncate names the item; the part is found wherever it
    sits, as clients send ``content_index`` 0 whatever the index)."""
    part = next((c for c in entry.item.content if c.type == "output_audio"), None)
    if entry.item.role != "assistant" or part is None:
        raise ConversationError(
            f"Item '{entry.item.id}' has no assistant audio to truncate", "invalid_item", "item_id"
        )
    return part


_ALLOWED_PARTS = {
    "user": {"input_text", "input_audio", "input_image"},
    "system": {"input_text"},
    "assistant": {"output_text", "output_audio", "text", "audio"},
}


def check_item(item: Item, max_text_chars: int) -> None:
    """A client's ``conversation.item.create`` item (or a ``response.input`` item): a message whose
    parts fit its role, a ``function_call`` or a ``function_call_output``; no text over the cap."""
    if item.type == "function_call":
        _require(item, ("call_id", "name"))
        item.arguments = item.arguments or ""
        _cap(item.arguments, max_text_chars, "item.arguments")
        item.role, item.content = None, []
        return
    if item.type == "function_call_output":
        _require(item, ("call_id",))
        item.output = item.output or ""
        _cap(item.output, max_text_chars, "item.output")
        item.role, item.content = None, []
        return
    if item.type == "mcp_approval_response":
        _require(item, ("approval_request_id",))
        if not isinstance(item.approve, bool):
            raise ConversationError("An mcp_approval_response needs 'approve'", "missing_required_parameter", "item.approve")
        item.role, item.content = None, []
        return
    if item.type != "message":
        raise ConversationError(
            f"Item type '{item.type}' is not supported; send a message, function_call, function_call_output "
            "or mcp_approval_response",
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
        if part.type == "input_image" and not part.image_url:
            raise ConversationError(
                "An input_image part needs an image_url (a data URL or an http(s) URL)",
                "missing_required_parameter",
                f"item.content[{i}].image_url",
            )
        for name in ("text", "transcript"):
            _cap(getattr(part, name), max_text_chars, f"item.content[{i}].{name}")


def _require(item: Item, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(item, name)
        if not isinstance(value, str) or not value:
            raise ConversationError(
                f"A {item.type} item needs '{name}'", "missing_required_parameter", f"item.{name}"
            )


def _cap(text: str | None, limit: int, param: str) -> None:
    if text is not None and len(text) > limit:
        raise ConversationError(
            f"Invalid '{param}': string too long. Expected a string with maximum length {limit}, "
            f"but got a string with length {len(text)} instead.",
            "string_above_max_length",
            param,
        )


def transcription_events(
    item_id: str, part: ContentPart, error: str | None, seconds: float = 0.0
) -> list[rt.ServerEvent]:
    """What the client hears about a user transcript (when it asked for transcription)."""
    if error is not None:
        failure = rt.TranscriptionError(code="transcription_failed", message=error)
        return [rt.ConversationItemInputAudioTranscriptionFailedEvent(item_id=item_id, content_index=0, error=failure)]
    text = part.transcript or ""
    return [
        rt.ConversationItemInputAudioTranscriptionDeltaEvent(item_id=item_id, content_index=0, delta=text),
        rt.ConversationItemInputAudioTranscriptionCompletedEvent(
            item_id=item_id, content_index=0, transcript=text, usage=rt.TranscriptionUsage(seconds=round(seconds, 3))
        ),
    ]
