"""The sections of the gateway's front: where it listens, its limits, the realtime sessions and their WebRTC
calls, the speech sessions, file transcription and the responder. ``config.gateway`` continues the line of section structs with the model stages'
sections and ends in ``GatewayConfig`` (see there).
"""

from __future__ import annotations

from typing import ClassVar, Literal

import msgspec


class ConfigError(ValueError):
    """The configuration cannot serve (a file missing, or not matching another); the message names the
    file and what to change. ``realtime-gw serve`` prints it and exits."""


class ServerSettings(msgspec.Struct, kw_only=True):
    """Where the gateway listens and who may use it."""

    SECTION: ClassVar[str] = "server"
    KEYS: ClassVar[dict[str, str]] = {}
    host: str = "127.0.0.1"
    """Address to listen on (0.0.0.0 = every interface)."""
    port: int = 8000
    """TCP port of HTTP, /v1/realtime, the speech stream and the OpenPI socket."""
    log_level: str = "info"
    """Python logging level: debug, info, warning, error."""
    api_key: str | None = None
    """Bearer key for HTTP and /v1/realtime, ``Api-Key`` for the OpenPI socket; unset = open."""
    api_keys: list[str] = msgspec.field(default_factory=list)
    """More accepted keys (each with its own session slots), in addition to ``api_key``."""
    allowed_origins: list[str] = msgspec.field(default_factory=list)
    """Browser origins allowed to open WebSockets besides the gateway's own; "*" = any."""
    allowed_hosts: list[str] = msgspec.field(default_factory=list)
    """Names the gateway answers to besides localhost, 127.0.0.1, ::1, the bind address and any IP
    literal ("*.example.com" matches subdomains; "*" = any). Other ``Host`` headers get HTTP 421 (a DNS
    rebinding page names its own domain); browsers' ``Origin`` headers are judged against the same list."""
    ws_per_message_deflate: bool = False
    """Offer permessage-deflate. Off: a small compressed frame can inflate to ``max_frame_bytes`` on the
    event loop (bounded by that size when on)."""


class LimitsSettings(ServerSettings, kw_only=True):
    """Bounds and timeouts of connections and sessions, for every socket (docs/security.md)."""

    SECTION: ClassVar[str] = "limits"
    max_sessions: int = 256
    """Open sessions of every socket together (realtime, speech stream, OpenPI); one more is refused."""
    max_sessions_per_key: int = 0
    """Open sessions (all sockets together) one key may hold; 0 = only the global limits."""
    session_starts_per_key_per_min: int = 0
    """Sessions one key may start in any 60 s (all sockets together); 0 = no limit. Over it: an error
    `rate_limit_exceeded` (realtime, speech stream) or HTTP 429 (OpenPI), with the wait in seconds."""
    max_connections_per_client: int = 64
    """Open TCP connections (HTTP and WebSocket) from one client address; further ones get HTTP 429.
    0 = no cap. Behind a proxy every client shares its address: raise it or let the proxy cap."""
    max_frame_bytes: int = 16 * 1024 * 1024
    """Largest WebSocket message accepted (uvicorn closes with 1009 above it)."""
    max_header_bytes: int = 64 * 1024
    """Request line plus headers of one HTTP request or WebSocket upgrade (h11); above it: HTTP 400."""
    handshake_timeout_s: float = 10.0
    """A connection must finish its request line and headers within this (from its first byte or from
    its previous response): raw sockets that send nothing and endless headers are closed."""
    outbound_queue_frames: int = 2048
    """Per-session outbound events waiting for the socket; a client that stops reading is closed."""
    send_timeout_s: float = 10.0
    """A socket write blocked this long means the client stopped reading: close 1008."""


class RealtimeSettings(LimitsSettings, kw_only=True):
    """Voice sessions on /v1/realtime (the OpenAI Realtime API)."""

    SECTION: ClassVar[str] = "realtime"
    realtime_idle_timeout_s: float = 900.0
    """A realtime session with no client event for this long gets `error` `session_expired`, then close
    1000. 0 = never."""
    realtime_max_session_s: float = 3600.0
    """Longest realtime session (OpenAI's limit is 60 min): `error` `session_expired`, then close 1000.
    0 = no limit."""
    audio_lead_ms: int = 400
    """How far ahead of real-time playback audio is sent (0 = as fast as produced)."""
    input_audio_rate_factor: float = 10.0
    """Realtime input audio may arrive this many times faster than real time (counted in decoded
    bytes at 24 kHz PCM16, 48,000 B/s), after a burst of ``input_audio_burst_s``; beyond that the
    session's socket is read more slowly (backpressure), never refused. 0 = no limit."""
    input_audio_burst_s: float = 60.0
    """Seconds of audio a realtime session may send at once before the rate above applies."""
    max_input_buffer_bytes: int = 15 * 1024 * 1024
    """Bound on the decoded input audio buffer of one session (PCM16)."""
    max_conversation_items: int = 512
    """Items a session with ``truncation: "disabled"`` may hold; one more is refused `conversation_full`."""
    max_retained_items: int = 4096
    """Items a session with truncation on (``auto``, ``retention_ratio``) keeps in memory: past it the
    oldest are forgotten silently (the client's own view is untouched), so a long call never fills up."""
    max_instructions_chars: int = 64 * 1024
    """Session or response ``instructions``; longer: `error` `string_above_max_length`, nothing echoed."""
    max_item_text_chars: int = 64 * 1024
    """Each text of a conversation item (a text part, a transcript, function arguments, a function
    output; `input_image` URLs are bounded by `max_frame_bytes` only); longer: `error`
    `string_above_max_length`."""
    max_tools: int = 128
    """Function tools in `session.tools` or a response's `tools`; their JSON is capped at
    ``max_instructions_chars`` too."""
    s2s_reply_end_ms: int = 640
    """Sessions on a speech-to-speech model (``--s2s``): a reply (one Realtime response) ends after the
    model's text stream has been padding and its voice quiet (``s2s_silence_dbfs``) for this long."""
    s2s_silence_dbfs: float = -45.0
    """Sessions on a speech-to-speech model: the model's voice at or below this RMS level (dB full
    scale) counts as quiet for the end of a reply; 0 = any audio does (replies end on the text stream
    alone)."""
    s2s_input_slack_ms: int = 160
    """Sessions on a speech-to-speech model: the stage steps every conversation once per 80 ms (a
    frame of the user's audio not there at its step is heard as silence), and while more than this
    much of a user's audio waits for its steps, quiet frames are dropped from its head (speech never),
    so a late or bursty client's audio comes back to within this of real time at its next pause."""


class WebrtcSettings(RealtimeSettings, kw_only=True):
    """Realtime calls over WebRTC (``POST /v1/realtime/calls``) and ephemeral client secrets."""

    SECTION: ClassVar[str] = "webrtc"
    webrtc_host: str = ""
    """Address of calls' UDP sockets and of the one host candidate of every SDP answer; "" = ``server.host``
    (127.0.0.1 on loopback). Binding 0.0.0.0: set the public address (no STUN is contacted; see TURN)."""
    webrtc_udp_ports: str = ""
    """UDP port range of calls' media, "first-last" (one port per call); "" = any free port."""
    webrtc_max_offer_bytes: int = 64 * 1024
    """Largest SDP offer (or multipart body) ``POST /v1/realtime/calls`` reads; above it: HTTP 413."""
    webrtc_client_secret_key: str | None = None
    """Key that seals client secrets (``ek_…``: AES-256-GCM, keys derived with HKDF-SHA256; at least 16
    characters): the app's browser holding a secret can neither read nor change the session config it
    carries. Every gateway process with the same key accepts the others' secrets, and they survive a
    restart. Unset: a random key per process (its secrets work on it alone; a warning says so when the
    first is minted). To rotate it, see ``webrtc_client_secret_previous_keys``."""
    webrtc_client_secret_key_file: str | None = None
    """File of client secret keys (a mounted secret), instead of setting ``webrtc_client_secret_key``: its
    first line seals, later lines (previous keys) only open secrets until they expire; blank lines are
    skipped. Re-read on SIGHUP without a restart (a file that cannot be read or holds a bad key is
    logged and the keys in use stay)."""
    webrtc_client_secret_previous_keys: list[str] = msgspec.field(default_factory=list)
    """Previous client secret keys (at least 16 characters each): they no longer seal, but still open the
    secrets they sealed until those expire (a rotation without refusing secrets that apps hold). Each
    secret names its key by a derived id, so opening tries one key however many are listed. Needs a
    sealing key (``webrtc_client_secret_key`` or the key file)."""
    webrtc_input_prefetch_frames: int = 1
    """Frames of a caller's audio aiortc's receive jitter buffer holds before decoding the oldest (aiortc's
    own default: 4, 80 ms of Opus). The gateway never plays the caller's audio, it only needs it in
    order, so 1 (the least: a frame is complete when the next one starts) costs nothing but latency saved;
    a lost packet stalls the buffer the same either way (until it holds 16, then is skipped and filled)."""
    webrtc_media_workers: int = 2
    """Processes that run calls' peer connections (DTLS/SRTP, Opus, the paced reply track), each call in
    the one with the fewest, so media cannot stall sessions or other calls; started with the first call.
    0 = on the gateway's own event loop, beside the sessions. Calls are admitted as WebSocket sessions
    are, whatever this is."""


class SpeechSettings(WebrtcSettings, kw_only=True):
    """Text to speech over HTTP (POST /v1/audio/speech) and the speech stream socket."""

    SECTION: ClassVar[str] = "speech"
    max_request_body_bytes: int = 1024 * 1024
    """Body of `POST /v1/audio/speech`; above it: HTTP 413."""
    speech_idle_timeout_s: float = 300.0
    """A speech stream with no client event for this long (and nothing being spoken): `error`
    `session_expired`, then close 1000. 0 = no limit."""
    speech_max_session_s: float = 3600.0
    """Longest speech stream: `error` `session_expired`, then close 1000. 0 = no limit."""
    speech_max_pending_chars: int = 16 * 1024
    """Speech stream text waiting to be spoken: the socket is not read while more waits; one
    `input.text` longer than this gets `error` `string_above_max_length`."""
    speech_max_utterance_chars: int = 256 * 1024
    """Text of one speech-stream utterance (from its first `input.text` to `input.done`); above it:
    `error` `string_above_max_length`, the piece dropped."""
    voices_dir: str | None = None
    """Directory where custom voices (`/v1/audio/voices`: each voice's metadata and what its model computed:
    a TTS voice's x-vector, never the sample; a speech-to-speech voice's codes, the sample compressed by the
    model's codec) and consent recordings persist across restarts, files 0600; created if missing. Unset:
    they live in memory until the gateway stops."""
    max_voices_per_key: int = 100
    """Custom voices one API key may keep (those being made count too), and as many consent recordings;
    more are refused until it deletes some."""


class TranscriptionSettings(SpeechSettings, kw_only=True):
    """File transcription over HTTP (POST /v1/audio/transcriptions), served by the ASR stage."""

    SECTION: ClassVar[str] = "transcription"
    transcription_max_file_bytes: int = 25 * 1024 * 1024
    """Largest upload to `POST /v1/audio/transcriptions` (OpenAI's own limit); above it: HTTP 413."""
    transcription_max_audio_s: float = 1800.0
    """Longest audio `POST /v1/audio/transcriptions` transcribes; longer: HTTP 400."""
    transcription_max_concurrent: int = 2
    """Files transcribed at once, each holding one ASR stream while it runs; one more: HTTP 429."""


class ResponderSettings(TranscriptionSettings, kw_only=True):
    """The chat model that writes a realtime session's replies."""

    SECTION: ClassVar[str] = "responder"
    KEYS: ClassVar[dict[str, str]] = {"responder": "kind"}
    responder: Literal["echo", "openai"] = "echo"
    """`echo` speaks back what it heard (no model); `openai` asks an OpenAI-compatible chat completions
    server at ``responder_url``."""
    responder_url: str = "http://127.0.0.1:8001/v1"
    """`openai`: base URL of the chat completions API (e.g. a local vLLM server)."""
    responder_model: str = "default"
    """`openai`: the model name sent with each request."""
    responder_api_key: str | None = None
    """`openai`: bearer key of the chat server; unset = none sent."""
    responder_max_tokens: int = 256
    """Reply tokens asked for when a response gives no ``max_output_tokens``."""
    responder_timeout_s: float = 30.0
    """`openai`: seconds a chat request may take before the response fails."""
    responder_context_tokens: int = 8192
    """The chat backend's context window. With truncation on, the oldest items leave the model's
    context (never the client's view) so instructions + items + tools + the reserved reply fit it;
    tokens are estimated (about 4 UTF-8 bytes per token plus a per-message overhead)."""


class McpSettings(ResponderSettings, kw_only=True):
    """MCP tools (``{"type": "mcp", ...}`` in a realtime session's tools): the gateway is the MCP
    client (streamable HTTP), lists the server's tools, hands them to the responder model and runs the
    calls it makes."""

    SECTION: ClassVar[str] = "mcp"
    KEYS: ClassVar[dict[str, str]] = {"mcp_allowed_urls": "allowed_urls"}
    mcp_allowed_urls: list[str] = msgspec.field(default_factory=list)
    """MCP server URLs sessions may use, exactly as a tool's ``server_url`` names them (a trailing
    ``/`` aside); repeatable. Empty (the default): no MCP server is allowed. A URL not on the list is
    refused at ``session.update`` and never connected to."""
    mcp_timeout_s: float = 10.0
    """Seconds one MCP request (connect, list the tools, or one tool call) may take; a call past it
    fails as the model's tool result, a listing past it fails the listing."""
    mcp_approval_timeout_s: float = 120.0
    """Seconds an ``mcp_approval_request`` waits for the client's ``mcp_approval_response``. Past it
    the gateway denies the call itself: it adds an ``mcp_approval_response`` item (``approve: false``,
    its ``reason`` says the approval timed out) to the conversation, the call is never made, and the
    response goes on (the model hears the call was not approved)."""
    mcp_max_result_chars: int = 16 * 1024
    """Characters of one MCP tool result kept (a longer one is cut, and says so) before it goes into
    the conversation and to the model."""
