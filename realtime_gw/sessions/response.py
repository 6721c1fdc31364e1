"""One response: what it was asked for, what it has produced so far, and how it appears on the wire.
Pure. Its lifecycle (phases, the one ``response.done``) is ``sessions/responses.py``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from realtime_gw.protocols import audio
from realtime_gw.protocols import realtime as rt
from realtime_gw.records.voice import ChatMessage
from realtime_gw.sessions.conversation import Entry, SpokenSpan
from realtime_gw.sessions.events import StartResponse


@dataclass(slots=True)
class LiveResponse:
    id: str
    epoch: int
    item_id: str
    audio: bool
    """Spoken (TTS); otherwise text only."""
    in_conversation: bool
    """Its item joins the conversation (``conversation: "auto"``)."""
    # -- what was asked for
    instructions: str = ""
    context: list[ChatMessage] | None = None
    """Out-of-band ``response.input``: replaces the conversation as the responder's context."""
    voice: str = "default"
    speed: float = 1.0
    max_output_tokens: int | None = None
    metadata: dict[str, str] | None = None
    conversation_id: str | None = None
    encoder: audio.OutputEncoder | None = None
    answer_after: bool = False
    """A user turn ended while this response was live and asked for an answer: create one when this
    response completes (dropped if it is cancelled or fails)."""
    # -- what it has produced
    frames: int = 0
    audio_ms: float = 0.0
    text: str = ""
    spans: list[SpokenSpan] = field(default_factory=list)

    def start(self, conversation: list[ChatMessage]) -> StartResponse:
        """What the worker is asked, built when it starts (every user transcript is in by then)."""
        messages = [ChatMessage("system", self.instructions)] if self.instructions else []
        messages += conversation if self.context is None else self.context
        return StartResponse(
            self.id,
            self.epoch,
            messages,
            audio=self.audio,
            voice=self.voice,
            speed=self.speed,
            max_output_tokens=self.max_output_tokens,
        )

    def sync(self, entry: Entry) -> None:
        """Bring its conversation entry up to what was produced (audio, spoken spans, words)."""
        entry.audio_ms = self.audio_ms
        entry.spans = list(self.spans)
        entry.item.content = self.item("completed").content

    # -- wire shapes
    def ref(self) -> dict[str, Any]:
        """The addressing fields every part-level event of this response carries."""
        return {"response_id": self.id, "item_id": self.item_id, "output_index": 0, "content_index": 0}

    def part(self) -> rt.Part:
        return rt.Part(type="audio", transcript=self.text) if self.audio else rt.Part(type="text", text=self.text)

    def item(self, status: str) -> rt.Item:
        content = []
        if status != "in_progress":
            content = [
                rt.ContentPart(type="output_audio", transcript=self.text)
                if self.audio
                else rt.ContentPart(type="output_text", text=self.text)
            ]
        return rt.Item(
            id=self.item_id, object="realtime.item", status=status, role="assistant", content=content  # type: ignore[arg-type]
        )

    def wire(self, status: str, details: rt.ResponseStatusDetails | None = None) -> rt.Response:
        final = status != "in_progress"
        output = [self.item("completed" if status == "completed" else "incomplete")] if final else []
        return rt.Response(
            id=self.id,
            status=status,  # type: ignore[arg-type]
            status_details=details,
            output=output,
            output_modalities=["audio"] if self.audio else ["text"],
            conversation_id=self.conversation_id if self.in_conversation else None,
            metadata=self.metadata,
            usage=rt.ResponseUsage() if final else None,
        )
