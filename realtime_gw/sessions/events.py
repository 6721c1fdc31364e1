"""What flows into a session besides client events (worker results, time) and what flows out (effects).

Every worker result carries the ``(response_id, epoch)`` it was started under; the session drops
results whose pair is not the live one, so late frames of a cancelled response can never leak out.
What the transport had to decide (a worker with no free slot: ``VadUnavailable``, ``AsrUnavailable``,
``ResponseRefused``)
comes in as an event too, so the session, not the transport, says what it means to the client.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, NoReturn

from realtime_gw.protocols.realtime import ServerEvent, error_event
from realtime_gw.records.s2s import S2sAudio, S2sOpen, S2sSilence
from realtime_gw.records.voice import ChatMessage, ChatUsage, ToolCallDelta, TtsFrame, VadProbs

# -- inputs ------------------------------------------------------------------------------------------


@dataclass(slots=True)
class VadResult:
    probs: VadProbs
    stream_id: int
    """Which VAD stream produced it; results of a replaced stream are dropped."""


@dataclass(slots=True)
class VadUnavailable:
    """The transport could not open this VAD stream, or reopen it after a worker fault (no free
    slot). The session decides what that means; the transport only reports it."""

    stream_id: int
    reason: str


@dataclass(slots=True)
class AsrUnavailable:
    """The transport could not open the streamed transcription of ``item_id`` (``StartAsr``: no free
    decoder). The session decides what that means: the turn goes on unheard by ASR and its audio is
    transcribed in one shot at the commit."""

    item_id: str
    reason: str


@dataclass(slots=True)
class TranscriptionDone:
    item_id: str
    text: str | None
    error: str | None = None


@dataclass(slots=True)
class TranscriptionDelta:
    """A partial hypothesis of the streamed transcription of ``item_id``: all its text so far (it
    may still change)."""

    item_id: str
    text: str


@dataclass(slots=True)
class TurnVerdict:
    """The turn model's answer to ``AskTurn``: the probability that the turn is complete, or None
    with ``error`` when it could not answer."""

    pause_id: int
    probability: float | None
    error: str | None = None


@dataclass(slots=True)
class ResponseTextDelta:
    response_id: str
    epoch: int
    text: str


@dataclass(slots=True)
class ResponseToolCall:
    """A fragment of a tool call the model is making in this response (see ``ToolCallDelta``)."""

    response_id: str
    epoch: int
    delta: ToolCallDelta


@dataclass(slots=True)
class ResponseUsage:
    """The backend's token counts for this response; arrives before ``ResponseFinished`` when known."""

    response_id: str
    epoch: int
    usage: ChatUsage


@dataclass(slots=True)
class ResponseAudio:
    response_id: str
    epoch: int
    frame: TtsFrame


@dataclass(slots=True)
class ResponseFinished:
    response_id: str
    epoch: int
    error: str | None = None


@dataclass(slots=True)
class McpToolsListed:
    """The transport listed an MCP server's tools (``ListMcpTools``): ``tools`` (name, description,
    input_schema, annotations), or None with ``error``."""

    item_id: str
    tools: list[dict[str, Any]] | None
    error: str | None = None


@dataclass(slots=True)
class McpCallDone:
    """An MCP tool call (``CallMcpTool``) ended: its ``output`` text, or ``error`` (a ``RealtimeMcp*Error``
    shape: tool_execution_error, protocol_error or http_error)."""

    response_id: str
    epoch: int
    item_id: str
    output: str | None
    error: dict[str, Any] | None = None


@dataclass(slots=True)
class ResponseRefused:
    """A worker had no free slot to start the response (``NoFreeSlot``): it never began. A refusal,
    not a fault: the worker never queues, so the session answers it at once."""

    response_id: str
    epoch: int
    reason: str


@dataclass(slots=True)
class PlaybackStarted:
    """The first audio frame of a response left the server at ``at`` (session clock, seconds)."""

    response_id: str
    at: float


@dataclass(slots=True)
class AudioDelivered:
    """Every queued audio frame of the response has been written to the socket (or purged)."""

    response_id: str
    epoch: int


@dataclass(slots=True)
class Tick:
    """Time passes (idle timeouts; a speech-to-speech session's input clock)."""


@dataclass(slots=True)
class S2sOpened:
    """The transport opened the session's stream on the speech-to-speech stage (``OpenS2s``): it
    holds a slot from now on, until the session ends. The model's steps come back as ``S2sFrame``s."""


@dataclass(slots=True)
class S2sRefused:
    """The speech-to-speech stage had no free slot for the session (``NoFreeSlot``): a duplex session
    is refused at once, never queued. ``prompt``: it refused the opening's voice prompt and persona
    instead (they do not fit the model's prompt budget); a stream that was open stays open."""

    reason: str
    prompt: bool = False


@dataclass(slots=True)
class S2sFailed:
    """The session's stream on the speech-to-speech stage ended with a worker fault."""

    reason: str


@dataclass(slots=True)
class ServerStopping:
    """The server is shutting down: the session ends now, telling its client why where its protocol can."""


# -- effects -----------------------------------------------------------------------------------------


@dataclass(slots=True)
class Send:
    event: ServerEvent
    response_id: str | None = None
    """Set on every event of a response: they keep their order in that response's lane, while
    events without it (acks, VAD, errors) are sent at once, never stuck behind paced audio."""
    audio_ms: float = 0.0
    """Set on audio deltas: the transport paces them to real time and can purge them."""


@dataclass(slots=True)
class StartVad:
    stream_id: int
    sample_rate: int


@dataclass(slots=True)
class StopVad:
    stream_id: int


@dataclass(slots=True)
class FeedVad:
    stream_id: int
    pcm: bytes


@dataclass(slots=True)
class Transcribe:
    item_id: str
    pcm: bytes
    sample_rate: int
    streamed: bool = False
    """The ASR stream of ``item_id`` (``StartAsr``) heard this audio: end it and take its transcript
    (the transcript is ready within a worker step). Without a usable stream: ``pcm`` in one shot."""
    silence_s: float = 0.0
    """The streamed audio ends with this much silence (server VAD's wait): the stream is told
    (``TrailingSilence``), so a recogniser that flushes its text runs that much less."""


@dataclass(slots=True)
class StartAsr:
    """Open a streamed transcription for the turn that will be committed as ``item_id``."""

    item_id: str
    sample_rate: int


@dataclass(slots=True)
class FeedAsr:
    item_id: str
    pcm: bytes


@dataclass(slots=True)
class CancelAsr:
    item_id: str


@dataclass(slots=True)
class AskTurn:
    """Ask the turn model whether the turn in ``pcm`` (its audio so far) is complete."""

    pause_id: int
    pcm: bytes
    sample_rate: int


@dataclass(slots=True)
class StartResponse:
    response_id: str
    epoch: int
    messages: list[ChatMessage]
    audio: bool
    """Speak the reply (TTS); otherwise text only."""
    voice: str = "default"
    speed: float = 1.0
    max_output_tokens: int | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    temperature: float | None = None


@dataclass(slots=True)
class CancelResponse:
    response_id: str
    epoch: int


@dataclass(slots=True)
class PurgeAudio:
    """Drop audio of this response that is queued but not yet sent."""

    response_id: str


@dataclass(slots=True)
class AwaitDelivery:
    """Report ``AudioDelivered`` once the response's queued audio has left (paced) for the client.

    A response stays live until its audio is out, so speech over it still cancels it: the session's
    idea of "in progress" matches what the client hears, not just what the model has produced."""

    response_id: str
    epoch: int


@dataclass(slots=True)
class ListMcpTools:
    """List the tools of the MCP server at ``server_url`` (already on the allow-list); answer
    ``McpToolsListed``. ``headers`` go to that server only and are never logged."""

    item_id: str
    server_url: str
    headers: dict[str, str]


@dataclass(slots=True)
class CallMcpTool:
    """Run one MCP tool call for a live response; answer ``McpCallDone``. Cancelled with the
    response (``CancelResponse``)."""

    response_id: str
    epoch: int
    item_id: str
    server_url: str
    headers: dict[str, str]
    name: str
    arguments: str


@dataclass(slots=True)
class OpenS2s:
    """Open the session's stream on the speech-to-speech stage; answer ``S2sOpened`` or ``S2sRefused``.
    Its inputs are the records themselves: ``S2sAudio`` (one step) and ``S2sSilence`` (force / release)."""

    request: S2sOpen
    model: str
    """The model the session is bound to (``gateway-echo`` is served by the transport itself)."""
    reopen: bool = False
    """A new prompt (persona or voice) for a session whose stream is open: the transport checks the
    prompt against the stage first (``S2sRefused(prompt=True)``, the old stream kept), then ends the old
    stream and opens this one in its slot."""


@dataclass(slots=True)
class Close:
    """Send what is queued (audio excepted), then close the socket."""

    code: int = 1000
    reason: str = ""


class Ids:
    """A session's ids (``event_…``, ``item_…``, ``resp_…``) from one counter, and the ``Send`` that
    stamps each outgoing event with its ``event_id``."""

    def __init__(self, session_id: str) -> None:
        self._tag = session_id[-8:]
        self._counter = itertools.count(1)
        self.last = 0
        """The number of the newest id."""

    def new(self, prefix: str) -> str:
        self.last = next(self._counter)
        return f"{prefix}_{self._tag}{self.last:05d}"

    def issued(self, prefix: str, value: str) -> bool:
        """Whether ``value`` is an id this session made with ``prefix``."""
        head = f"{prefix}_{self._tag}"
        number = value[len(head) :]
        return value.startswith(head) and number.isdigit() and 0 < int(number) <= self.last

    def send(self, event: ServerEvent, response_id: str | None = None, audio_ms: float = 0.0) -> Send:
        event.event_id = self.new("event")
        return Send(event, response_id=response_id, audio_ms=audio_ms)

    def error(
        self,
        message: str,
        code: str,
        param: str | None = None,
        event_id: str | None = None,
        type: str = "invalid_request_error",
    ) -> Send:
        return self.send(error_event(message, code=code, param=param, event_id=event_id, type=type))


ListenEffect = StartAsr | FeedAsr | CancelAsr | AskTurn
"""What the transport's listening part runs (streamed ASR, turn questions)."""
S2sEffect = OpenS2s | S2sAudio | S2sSilence
"""What the transport's speech-to-speech link runs (the session's stream on that stage)."""
Effect = (
    AwaitDelivery
    | Close
    | Send
    | StartVad
    | StopVad
    | FeedVad
    | Transcribe
    | StartResponse
    | CancelResponse
    | PurgeAudio
    | ListenEffect
    | S2sEffect
    | ListMcpTools
    | CallMcpTool
)


def unhandled(effect: NoReturn) -> NoReturn:
    """The ``case _`` of every effect interpreter: a type checker flags an effect type the ``match``
    forgot (``effect`` is then not ``Never``), and at run time it raises instead of dropping it."""
    raise TypeError(f"no interpreter for the effect {effect!r}")


@dataclass(slots=True)
class Limits:
    """Bounds and catalogues the gateway gives each session (from the config and the TTS backend)."""

    max_input_buffer_bytes: int = 15 * 1024 * 1024
    max_items: int = 512
    """With ``truncation: "disabled"``: one more item is refused ``conversation_full``."""
    voices: frozenset[str] = field(default_factory=lambda: frozenset({"default"}))
    model: str = "realtime-gw"
    max_retained_items: int = 4096
    """With truncation on: the oldest items past this many are forgotten silently."""
    max_instructions_chars: int = 64 * 1024
    max_item_text_chars: int = 64 * 1024
    max_tools: int = 128
    context_tokens: int = 8192
    """The chat backend's context window (``responder_context_tokens``)."""
    reply_tokens: int = 256
    """What the responder asks for a reply without ``max_output_tokens`` (``responder_max_tokens``):
    kept free in the context window."""
    mcp_allowed_urls: tuple[str, ...] = ()
    """MCP server URLs a session may use (``mcp_allowed_urls``); empty: none."""
    mcp_approval_timeout_s: float = 120.0
    """How long an ``mcp_approval_request`` waits for its answer (``mcp_approval_timeout_s``)."""
