"""One response: what it was asked for, what it has produced so far, and how it appears on the wire.
Pure. Its lifecycle (phases, the one ``response.done``) is ``sessions/response_lifecycle.py``.

Its outputs, in ``output_index`` order: the message (spoken or written; announced at creation when no
tools are offered, else at its first text or audio, so a response that only calls tools has none),
then its MCP items, then its function calls (announced when generation completes, so they always
follow the message and a cancelled response never hands the client a half-made call to run).

A response that called MCP tools goes on after their results, within itself (``sessions/mcp.py``):
each model round adds its own message and MCP items after the earlier rounds' (``earlier``), so the
current round's outputs start at ``len(earlier)``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from realtime_gw.protocols import audio
from realtime_gw.protocols import realtime as rt
from realtime_gw.records.voice import ChatMessage, ChatUsage
from realtime_gw.sessions.conversation import Entry, SpokenSpan
from realtime_gw.sessions.events import StartResponse
from realtime_gw.sessions.tools import FunctionCall, FunctionCalls

AUDIO_TOKENS_PER_S = 20
"""Output audio tokens are estimated from the audio's duration (one per 50 ms, as OpenAI's realtime
models bill audio): the backend only counts the text it wrote, the gateway's TTS made the audio."""


def forced_server(choice: str | dict[str, Any]) -> str | None:
    """The MCP server a ``tool_choice`` forces the model to call (``{"type": "mcp", ...}``)."""
    return choice["server_label"] if isinstance(choice, dict) and choice["type"] == "mcp" else None


def model_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    """The tool choice as the model takes it: MCP tools reach it as functions (``mcp.offer``), so a
    choice of one is a choice of that function; of a server's tools, any (only those are offered)."""
    if forced_server(choice) is None:
        return choice
    name = choice["name"]  # type: ignore[index]
    return "required" if name is None else {"type": "function", "name": name}


@dataclass(slots=True)
class LiveResponse:
    id: str
    epoch: int
    item_id: str
    audio: bool
    """Spoken (TTS); otherwise text only."""
    in_conversation: bool
    """Its items join the conversation (``conversation: "auto"``)."""
    # -- what was asked for
    instructions: str = ""
    context: list[ChatMessage] | None = None
    """``response.input``: replaces the conversation as the responder's context."""
    voice: str = "default"
    speed: float = 1.0
    max_output_tokens: int | None = None
    metadata: dict[str, str] | None = None
    conversation_id: str | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    temperature: float | None = None
    truncation: rt.Truncation = "auto"
    encoder: audio.OutputEncoder | None = None
    answer_after: bool = False
    """A user turn ended while this response was live and asked for an answer: create one when this
    response completes (dropped if it is cancelled or fails)."""
    # -- what it has produced
    opened: bool = False
    """Its message item was announced (``response.output_item.added``)."""
    closed: bool = False
    """Its message item is done (before the MCP calls of its round are announced)."""
    frames: int = 0
    audio_ms: float = 0.0
    text: str = ""
    spans: list[SpokenSpan] = field(default_factory=list)
    calls: FunctionCalls = field(default_factory=FunctionCalls)
    function_tools: list[dict[str, Any]] = field(default_factory=list)
    """The function tools it was asked with (``tools`` adds the listed MCP tools to them)."""
    mcp_servers: dict[str, Any] = field(default_factory=dict)
    """Its MCP servers by label, each with its ``require_approval`` (``mcp.UsedServers``)."""
    answers: list[rt.Item] = field(default_factory=list)
    """Out of the conversation: the ``mcp_approval_response`` items its requests got."""
    mcp_names: dict[str, str] = field(default_factory=dict)
    """Tool names offered that are MCP servers' tools, and their server's label."""
    mcp_started: bool = False
    """Its MCP calls were announced (approval requests and calls)."""
    mcp_outputs: list[tuple[str, FunctionCall]] = field(default_factory=list)
    """Its ``mcp_approval_request`` (``"approval"``) and ``mcp_call`` (``"call"``) items, in output order."""
    usage: ChatUsage | None = None
    """The backend's token counts (``ResponseUsage``), when it gives them."""
    prompt_tokens: int = 0
    """The estimated size of what the responder was sent (usage when the backend reports none)."""
    # -- earlier model rounds (a response that called MCP tools goes on after their results)
    rounds: int = 1
    earlier: list[rt.Item] = field(default_factory=list)
    """The outputs of its earlier rounds, ended, in output order."""
    earlier_usage: ChatUsage | None = None
    earlier_prompt_tokens: int = 0
    earlier_written: str = ""
    earlier_audio_ms: float = 0.0

    @property
    def message_index(self) -> int:
        """The ``output_index`` of this round's message."""
        return len(self.earlier)

    def round_outputs(self) -> list[rt.Item]:
        """This round's outputs so far (ended), in output order."""
        opened = [self.item("completed")] if self.opened else []
        return opened + [c.approval_item() if k == "approval" else c.item("completed") for k, c in self.mcp_outputs]

    def next_round(self, item_id: str, epoch: int) -> None:
        """Every MCP call of this round has ended: the model goes on in a new round, which writes a
        new message (``item_id``) after this round's outputs."""
        self.earlier += self.round_outputs()
        self.earlier_usage = _added(self.earlier_usage, self.usage)
        self.earlier_prompt_tokens += self.prompt_tokens
        self.earlier_written += self._written()
        self.earlier_audio_ms += self.audio_ms
        self.rounds += 1
        self.item_id, self.epoch = item_id, epoch
        self.opened, self.closed, self.text, self.spans, self.audio_ms = False, False, "", [], 0.0
        self.calls, self.mcp_outputs, self.mcp_started, self.usage = FunctionCalls(), [], False, None
        if self.tool_choice == "required" or isinstance(self.tool_choice, dict):
            self.tool_choice = "auto"  # a forced call was made: the results are answered, not called again

    def _written(self) -> str:
        return self.text + "".join(c.name + c.arguments for c in self.calls)

    @property
    def offers_tools(self) -> bool:
        return bool(self.tools or self.mcp_servers) and self.tool_choice != "none"

    def start(self, messages: list[ChatMessage]) -> StartResponse:
        """What the worker is asked, built when it starts (every user transcript is in by then)."""
        return StartResponse(
            self.id,
            self.epoch,
            messages,
            audio=self.audio,
            voice=self.voice,
            speed=self.speed,
            max_output_tokens=self.max_output_tokens,
            tools=self.tools if self.offers_tools and self.tools else [],
            tool_choice=model_choice(self.tool_choice),
            temperature=self.temperature,
        )

    def sync(self, entry: Entry) -> None:
        """Bring its conversation entry up to what was produced (audio, spoken spans, words)."""
        entry.audio_ms = entry.generated_ms = self.audio_ms
        entry.spans = list(self.spans)
        entry.item.content = self.item("completed").content

    # -- wire shapes
    def ref(self) -> dict[str, Any]:
        """The addressing fields every part-level event of this round's message carries."""
        return {
            "response_id": self.id,
            "item_id": self.item_id,
            "output_index": self.message_index,
            "content_index": 0,
        }

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
        output: list[rt.Item] = list(self.earlier)
        if final and self.opened:
            output.append(self.item("completed" if status == "completed" else "incomplete"))
        output += [c.approval_item() if kind == "approval" else c.item("completed") for kind, c in self.mcp_outputs]
        if status == "completed":
            output += [call.item("completed") for call in self.calls.for_client]
        return rt.Response(
            id=self.id,
            status=status,  # type: ignore[arg-type]
            status_details=details,
            output=output,
            output_modalities=["audio"] if self.audio else ["text"],
            conversation_id=self.conversation_id if self.in_conversation else None,
            metadata=self.metadata,
            usage=self.wire_usage() if final else None,
        )

    def wire_usage(self) -> rt.ResponseUsage:
        """The backend's counts where it gave them, else estimates (input from the request's size,
        output text at ~4 characters a token); output audio tokens from the audio's duration."""
        u = _added(self.earlier_usage, self.usage)
        text_in = u.input_tokens if u is not None else self.earlier_prompt_tokens + self.prompt_tokens
        cached = u.cached_tokens if u is not None else 0
        written = self.earlier_written + self._written()
        text_out = u.output_tokens if u is not None else -(-len(written) // 4)
        audio_out = round((self.earlier_audio_ms + self.audio_ms) / 1000 * AUDIO_TOKENS_PER_S)
        return rt.ResponseUsage(
            total_tokens=text_in + text_out + audio_out,
            input_tokens=text_in,
            output_tokens=text_out + audio_out,
            input_token_details=rt.InputTokenDetails(
                text_tokens=text_in, cached_tokens=cached, cached_tokens_details={"text_tokens": cached}
            ),
            output_token_details=rt.OutputTokenDetails(text_tokens=text_out, audio_tokens=audio_out),
        )


def _added(a: ChatUsage | None, b: ChatUsage | None) -> ChatUsage | None:
    """Token counts of two model rounds together (either may be unknown)."""
    if a is None or b is None:
        return a or b
    return ChatUsage(
        a.input_tokens + b.input_tokens, a.output_tokens + b.output_tokens, a.cached_tokens + b.cached_tokens
    )
