"""The one live response of a session and how it appears on the wire. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from realtime_gw.protocols import audio
from realtime_gw.protocols import realtime as rt
from realtime_gw.sessions.conversation import SpokenSpan
from realtime_gw.sessions.events import StartResponse


@dataclass(slots=True)
class LiveResponse:
    id: str
    epoch: int
    item_id: str
    audio: bool
    in_conversation: bool
    params: StartResponse | None = None
    started: bool = False
    frames: int = 0
    audio_ms: float = 0.0
    text: str = ""
    spans: list[SpokenSpan] = field(default_factory=list)
    encoder: audio.OutputEncoder | None = None
    metadata: dict[str, str] | None = None
    conversation_id: str | None = None

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
