"""Session settings and ``session.update``: validated merge of a partial update. Pure.

An absent field is unchanged; an explicit ``null`` means the field's default (for the nested objects
``audio``, ``audio.input``, ``audio.output`` and ``duplex``: nothing to change in them)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

import msgspec
from msgspec import UNSET

from realtime_gw.protocols import audio
from realtime_gw.protocols import realtime as rt
from realtime_gw.records.voice import OUTPUT_RATE
from realtime_gw.sessions.duplex import DuplexSettings

OUTPUT_RATES = {"audio/pcm": OUTPUT_RATE, "audio/pcmu": 8000, "audio/pcma": 8000}
OUTPUT_FORMATS = frozenset(OUTPUT_RATES)
SEMANTIC_SILENCE_MS = {"low": 1200, "medium": 700, "high": 400, "auto": 700}
"""semantic_vad is approximated by server VAD with a silence length per eagerness."""


class SessionError(Exception):
    """A client event that breaks a rule; becomes one ``error`` event, state unchanged."""

    def __init__(self, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.param = param


SESSION_TYPES = ("realtime", "transcription")
"""The session's mode: ``realtime`` (a conversation: turns are answered) or ``transcription`` (live
captions: turns are transcribed, never answered; no response, no output audio, no TTS slot)."""


@dataclass(slots=True)
class SessionSettings:
    type: str = "realtime"
    include: list[str] | None = None
    """Transcription sessions: what the client asked ``include``d (checked: none is served yet)."""
    instructions: str = ""
    output_modalities: list[str] = field(default_factory=lambda: ["audio"])
    input_format: str = "audio/pcm"
    input_rate: int = 24000
    transcription: rt.TranscriptionConfig | None = None
    turn_detection: rt.ServerVad | rt.SemanticVad | None = field(default_factory=rt.ServerVad)
    noise_reduction: str | None = None
    output_format: str = "audio/pcm"
    voice: str = "default"
    speed: float = 1.0
    max_output_tokens: int | None = None
    duplex: DuplexSettings = field(default_factory=DuplexSettings)
    tools: list[dict[str, Any]] = field(default_factory=list)
    """Function tools (the client runs them) and MCP tools (the gateway runs them: ``sessions/mcp.py``),
    validated."""
    tool_choice: str | dict[str, Any] = "auto"
    truncation: rt.Truncation = "auto"

    @classmethod
    def of_type(cls, kind: str) -> SessionSettings:
        """A new session's settings; ``transcription``: a transcription session (``?intent=transcription``),
        its turns transcribed and never answered."""
        return cls(type=kind, transcription=rt.TranscriptionConfig()) if kind == "transcription" else cls()

    @property
    def answers(self) -> bool:
        """Turns get responses (a conversation), or only transcripts (a transcription session)."""
        return self.type == "realtime"

    def _input_wire(self) -> dict[str, Any]:
        td: Any = None if self.turn_detection is None else msgspec.to_builtins(self.turn_detection)
        in_fmt: dict[str, Any] = {"type": self.input_format}
        if self.input_format == "audio/pcm" and self.input_rate == OUTPUT_RATE:
            in_fmt["rate"] = self.input_rate
        elif self.input_format == "audio/pcm":
            # The API's `rate` only admits 24000; other input rates are echoed in an additive field.
            in_fmt["sample_rate_hz"] = self.input_rate
        return {
            "format": in_fmt,
            "transcription": None if self.transcription is None else msgspec.to_builtins(self.transcription),
            "turn_detection": td,
            "noise_reduction": None if self.noise_reduction is None else {"type": self.noise_reduction},
        }

    def to_wire(
        self, session_id: str, model: str, duplex: bool = False, capabilities: dict[str, Any] | None = None
    ) -> rt.SessionOut | rt.TranscriptionSessionOut:
        """The session as the client sees it; ``capabilities``: an additive block (a speech-to-speech
        model's, ``s2s.py``), else the duplex one of ``?duplex=1``."""
        if not self.answers:
            return rt.TranscriptionSessionOut(id=session_id, audio={"input": self._input_wire()}, include=self.include)
        out_fmt: dict[str, Any] = {"type": self.output_format}
        if self.output_format == "audio/pcm":
            out_fmt["rate"] = OUTPUT_RATE
        return rt.SessionOut(
            id=session_id,
            model=model,
            instructions=self.instructions,
            output_modalities=list(self.output_modalities),
            audio={
                "input": self._input_wire(),
                "output": {"format": out_fmt, "voice": self.voice, "speed": self.speed},
            },
            max_output_tokens="inf" if self.max_output_tokens is None else self.max_output_tokens,
            tools=[wire_tool(t) for t in self.tools],
            tool_choice=self.tool_choice,
            truncation=self.truncation,
            capabilities=capabilities
            or ({"supports_barge_in": True, "supports_playback_ack": True, "chunk_period_ms": 80} if duplex else None),
            duplex=dataclasses.asdict(self.duplex) if duplex else None,
        )



def check_voice(voice: str | rt.VoiceId | None, voices: frozenset[str], param: str) -> str:
    """A voice by name or as ``{"id": name}``; ``None``: the default voice."""
    if voice is None:
        return "default"
    if isinstance(voice, rt.VoiceId):
        voice = voice.id
    if voice not in voices:
        raise SessionError(f"Unknown voice '{voice}'; available: {', '.join(sorted(voices))}", "invalid_value", param)
    return voice


@dataclass(frozen=True, slots=True)
class TextLimits:
    """Echo bounds: what a client may make the session store and echo back."""

    max_instructions_chars: int = 64 * 1024
    max_tools: int = 128


def check_instructions(text: str, limits: TextLimits, param: str) -> str:
    if len(text) > limits.max_instructions_chars:
        raise SessionError(
            f"Invalid '{param}': string too long. Expected a string with maximum length "
            f"{limits.max_instructions_chars}, but got a string with length {len(text)} instead.",
            "string_above_max_length",
            param,
        )
    return text


def apply_session_update(
    current: SessionSettings, p: rt.SessionParams, voices: frozenset[str], limits: TextLimits = TextLimits()
) -> SessionSettings:
    """The settings after ``session.update``; raises ``SessionError`` (naming the field) and leaves
    ``current`` untouched when anything is invalid (so nothing oversized is ever echoed)."""
    new = dataclasses.replace(current)
    if p.type not in (UNSET, None, *SESSION_TYPES):
        raise SessionError(
            f"Unsupported session type '{p.type}'; use 'realtime' or 'transcription'", "invalid_value", "session.type"
        )
    if p.type in SESSION_TYPES:
        new.type = p.type  # type: ignore[assignment]
    if not new.answers:
        _check_transcription_session(new, p)
    if p.instructions is not UNSET:
        new.instructions = check_instructions(p.instructions or "", limits, "session.instructions")
    if p.output_modalities is not UNSET:
        if p.output_modalities is not None and not p.output_modalities:
            raise SessionError("output_modalities must not be empty", "invalid_value", "session.output_modalities")
        new.output_modalities = list(p.output_modalities or ["audio"])
    if p.max_output_tokens is not UNSET:
        if isinstance(p.max_output_tokens, int) and p.max_output_tokens < 1:
            raise SessionError("max_output_tokens must be at least 1", "invalid_value", "session.max_output_tokens")
        new.max_output_tokens = p.max_output_tokens if isinstance(p.max_output_tokens, int) else None
    if p.tools is not UNSET:
        new.tools = check_tools(p.tools or [], limits.max_tools, limits.max_instructions_chars, "session.tools")
    if p.tool_choice is not UNSET or p.tools is not UNSET:
        choice = new.tool_choice if p.tool_choice is UNSET else p.tool_choice
        new.tool_choice = check_tool_choice(choice, new.tools, "session.tool_choice")
    if p.truncation is not UNSET:
        new.truncation = _checked_truncation(p.truncation)
    if p.audio is not UNSET and p.audio is not None:
        _apply_audio(new, p.audio, voices, limits)
    if p.duplex is not UNSET and p.duplex is not None:
        d = p.duplex
        new.duplex = DuplexSettings(
            overlap_short_ack_ms=new.duplex.overlap_short_ack_ms
            if d.overlap_short_ack_ms is UNSET
            else d.overlap_short_ack_ms,
            overlap_barge_in_ms=new.duplex.overlap_barge_in_ms
            if d.overlap_barge_in_ms is UNSET
            else d.overlap_barge_in_ms,
            echo_guard_ms=new.duplex.echo_guard_ms if d.echo_guard_ms is UNSET else d.echo_guard_ms,
        )
        if new.duplex.overlap_barge_in_ms < new.duplex.overlap_short_ack_ms:
            raise SessionError(
                "overlap_barge_in_ms must not be shorter than overlap_short_ack_ms",
                "invalid_value",
                "session.duplex.overlap_barge_in_ms",
            )
    if not new.answers and new.transcription is None:
        new.transcription = rt.TranscriptionConfig()  # what a transcription session is for
    return new


TRANSCRIPTION_INCLUDES = ("item.input_audio_transcription.logprobs",)


def _check_transcription_session(new: SessionSettings, p: rt.SessionParams) -> None:
    """A transcription session has input audio and ``include`` only; its turns are always transcribed."""
    for name in ("instructions", "output_modalities", "tools", "tool_choice", "max_output_tokens", "prompt"):
        if getattr(p, name) not in (UNSET, None):
            raise SessionError(
                f"'{name}' is not a setting of a transcription session", "invalid_value", f"session.{name}"
            )
    if p.audio not in (UNSET, None) and p.audio.output not in (UNSET, None):  # type: ignore[union-attr]
        raise SessionError(
            "A transcription session has no output audio", "invalid_value", "session.audio.output"
        )
    if p.include is not UNSET:
        for item in p.include or []:
            if item not in TRANSCRIPTION_INCLUDES:
                raise SessionError(f"Unknown include '{item}'", "invalid_value", "session.include")
            raise SessionError(
                "The gateway's ASR stages give no log probabilities", "invalid_value", "session.include"
            )
        new.include = p.include


def _checked_truncation(t: rt.Truncation | None) -> rt.Truncation:
    if t is None:
        return "auto"
    if isinstance(t, rt.RetentionRatio) and not 0.0 < t.retention_ratio <= 1.0:
        raise SessionError(
            "retention_ratio must be in (0, 1]", "invalid_value", "session.truncation.retention_ratio"
        )
    return t


def _apply_audio(new: SessionSettings, a: rt.AudioConfig, voices: frozenset[str], limits: TextLimits) -> None:
    if a.input is not UNSET and a.input is not None:
        i = a.input
        if i.format is not UNSET:
            fmt = i.format or rt.AudioFormat()
            try:
                new.input_rate = audio.input_rate(fmt.type, fmt.rate)
            except ValueError as e:
                raise SessionError(str(e), "invalid_value", "session.audio.input.format") from None
            new.input_format = fmt.type
        if i.transcription is not UNSET:
            if i.transcription is not None and i.transcription.prompt is not None:
                check_instructions(i.transcription.prompt, limits, "session.audio.input.transcription.prompt")
            new.transcription = i.transcription
        if i.turn_detection is not UNSET:
            td = i.turn_detection
            if isinstance(td, rt.ServerVad):
                if not 0.0 < td.threshold < 1.0:
                    raise SessionError(
                        "threshold must be between 0 and 1",
                        "invalid_value",
                        "session.audio.input.turn_detection.threshold",
                    )
                if td.silence_duration_ms < 0 or td.prefix_padding_ms < 0:
                    raise SessionError(
                        "durations must not be negative",
                        "invalid_value",
                        "session.audio.input.turn_detection",
                    )
            new.turn_detection = td
        if i.noise_reduction is not UNSET:
            new.noise_reduction = None if i.noise_reduction is None else i.noise_reduction.type
    if a.output is not UNSET and a.output is not None:
        o = a.output
        if o.format is not UNSET:
            out = o.format or rt.AudioFormat()
            if out.type not in OUTPUT_FORMATS:
                raise SessionError(
                    f"Unsupported output format '{out.type}'; use one of {sorted(OUTPUT_FORMATS)}",
                    "invalid_value",
                    "session.audio.output.format.type",
                )
            if out.type == "audio/pcm" and out.rate not in (None, OUTPUT_RATE):
                raise SessionError(
                    f"Output audio/pcm is {OUTPUT_RATE} Hz; rate {out.rate} is not supported",
                    "invalid_value",
                    "session.audio.output.format.rate",
                )
            new.output_format = out.type
        if o.voice is not UNSET:
            new.voice = check_voice(o.voice, voices, "session.audio.output.voice")
        if o.speed is not UNSET:
            speed = 1.0 if o.speed is None else o.speed
            if not audio.speed_in_range(speed):
                raise SessionError(audio.SPEED_ERROR, "invalid_value", "session.audio.output.speed")
            new.speed = speed


TOOL_CHOICES = ("auto", "none", "required")


def check_tools(tools: list[Any], max_tools: int, max_chars: int, param: str) -> list[dict[str, Any]]:
    """``tools`` as given, each a function tool with a name and an object ``parameters`` schema, names
    unique; raises ``SessionError`` naming the first bad one."""
    if len(tools) > max_tools:
        raise SessionError(f"At most {max_tools} tools are allowed, got {len(tools)}", "invalid_value", param)
    if len(msgspec.json.encode(tools)) > max_chars:
        raise SessionError(
            f"Tool definitions are longer than {max_chars} characters", "string_above_max_length", param
        )
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        where = f"{param}[{i}]"
        if not isinstance(tool, dict):
            raise SessionError(f"{where} must be an object", "invalid_value", where)
        kind = tool.get("type") or "function"
        if kind == "mcp":
            mcp = check_mcp_tool(tool, where)
            if f"mcp:{mcp['server_label']}" in seen:
                raise SessionError(f"Duplicate server_label '{mcp['server_label']}'", "invalid_value", f"{where}.server_label")
            seen.add(f"mcp:{mcp['server_label']}")
            out.append(mcp)
            continue
        if kind != "function":
            raise SessionError(
                f"Tool type '{kind}' is not supported; only 'function' and 'mcp' tools are", "invalid_value", f"{where}.type"
            )
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise SessionError(f"{where} needs a 'name'", "missing_required_parameter", f"{where}.name")
        if name in seen:
            raise SessionError(f"Duplicate tool name '{name}'", "invalid_value", f"{where}.name")
        seen.add(name)
        params = tool.get("parameters")
        if params is not None and (not isinstance(params, dict) or params.get("type", "object") != "object"):
            raise SessionError(
                f"Tool '{name}': 'parameters' must be a JSON Schema object ({{\"type\": \"object\", ...}})",
                "invalid_value",
                f"{where}.parameters",
            )
        description = tool.get("description")
        if description is not None and not isinstance(description, str):
            raise SessionError(f"Tool '{name}': 'description' must be a string", "invalid_value", f"{where}.description")
        out.append({"type": "function", **{k: v for k, v in tool.items() if k != "type"}})
    return out


def check_tool_choice(choice: Any, tools: list[dict[str, Any]], param: str) -> str | dict[str, Any]:
    """``auto`` | ``none`` | ``required`` | ``{"type": "function", "name": <a defined tool>}`` |
    ``{"type": "mcp", "server_label": <a defined MCP tool's>, "name": <its tool, or None: any>}``."""
    if isinstance(choice, dict) and choice.get("type") == "mcp":
        return _mcp_choice(choice, tools, param)
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise SessionError(
                f"tool_choice must be one of {', '.join(TOOL_CHOICES)} or a function, got '{choice}'",
                "invalid_value",
                param,
            )
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        if choice["name"] not in {t["name"] for t in tools if t["type"] == "function"}:
            raise SessionError(f"tool_choice names '{choice['name']}', which is not a defined tool", "invalid_value", param)
        return {"type": "function", "name": choice["name"]}
    raise SessionError(
        "tool_choice must be 'auto', 'none', 'required', {\"type\": \"function\", \"name\": ...} "
        "or {\"type\": \"mcp\", \"server_label\": ..., \"name\": ...}",
        "invalid_value",
        param,
    )


def _mcp_choice(choice: dict[str, Any], tools: list[dict[str, Any]], param: str) -> dict[str, Any]:
    """An MCP tool choice names one of the MCP servers in ``tools`` and, optionally, one of its tools
    that ``allowed_tools`` admits (whether the server lists it is known once it is listed: ``mcp.py``)."""
    servers = {t["server_label"]: t for t in tools if t["type"] == "mcp"}
    label, name = choice.get("server_label"), choice.get("name")
    if not isinstance(label, str) or label not in servers:
        defined = ", ".join(f"'{s}'" for s in servers) or "none"
        raise SessionError(
            f"tool_choice names MCP server '{label}', which is not among the tools (MCP servers: {defined})",
            "invalid_value",
            f"{param}.server_label",
        )
    if name is not None and not isinstance(name, str):
        raise SessionError("tool_choice.name must be a tool's name", "invalid_value", f"{param}.name")
    allowed = servers[label]["allowed_tools"]
    if name is not None and allowed is not None and name not in allowed:
        raise SessionError(
            f"tool_choice names tool '{name}' of MCP server '{label}', which its allowed_tools leave out "
            f"(allowed: {', '.join(allowed) or 'none'})",
            "invalid_value",
            f"{param}.name",
        )
    return {"type": "mcp", "server_label": label, "name": name}


_LABEL = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
APPROVALS = ("always", "never")
HOSTED = {"connector_id": "an OpenAI-hosted connector", "tunnel_id": "an OpenAI Secure MCP Tunnel"}


def _names_filter(f: Any) -> bool:
    """An MCP tool filter: ``{"tool_names": [...]}`` (``read_only`` is accepted and not used)."""
    return isinstance(f, dict) and isinstance(f.get("tool_names", []), list)


def check_mcp_tool(tool: dict[str, Any], where: str) -> dict[str, Any]:
    """An ``mcp`` tool as given, checked and normalized; raises ``SessionError`` naming the bad field."""
    label = tool.get("server_label")
    if not isinstance(label, str) or not _LABEL.match(label):
        raise SessionError(
            f"{where} needs a 'server_label' of letters, digits, '_' or '-'", "invalid_value", f"{where}.server_label"
        )
    for hosted in ("connector_id", "tunnel_id"):  # OpenAI's own infrastructure: nothing to connect to here
        if tool.get(hosted) is not None:
            raise SessionError(
                f"{where}.{hosted} '{tool[hosted]}' names {HOSTED[hosted]}, which this gateway cannot reach; "
                "give the MCP server's 'server_url' instead",
                "unsupported_value",
                f"{where}.{hosted}",
            )
    url = tool.get("server_url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise SessionError(f"{where} needs a 'server_url' (http or https)", "invalid_value", f"{where}.server_url")
    headers = tool.get("headers") or {}
    if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise SessionError(f"{where}.headers must map names to strings", "invalid_value", f"{where}.headers")
    token = tool.get("authorization")
    if token is not None:  # an OAuth access token: the server gets it as a bearer token
        if not isinstance(token, str) or any(k.lower() == "authorization" for k in headers):
            raise SessionError(
                f"{where}.authorization must be a string, and not given beside an Authorization header",
                "invalid_value",
                f"{where}.authorization",
            )
        headers = {**headers, "Authorization": f"Bearer {token}"}
    allowed = tool.get("allowed_tools")
    if isinstance(allowed, dict):
        allowed = allowed.get("tool_names")
    if allowed is not None and not (isinstance(allowed, list) and all(isinstance(n, str) for n in allowed)):
        raise SessionError(
            f"{where}.allowed_tools must be a list of tool names or {{\"tool_names\": [...]}}",
            "invalid_value",
            f"{where}.allowed_tools",
        )
    approval = tool.get("require_approval", "always")
    if approval not in APPROVALS and not (
        isinstance(approval, dict) and set(approval) <= {"always", "never"} and all(_names_filter(f) for f in approval.values())
    ):
        raise SessionError(
            f"{where}.require_approval must be 'always', 'never' or "
            "{\"always\": {\"tool_names\": [...]}, \"never\": {\"tool_names\": [...]}}",
            "invalid_value",
            f"{where}.require_approval",
        )
    return {
        "type": "mcp",
        "server_label": label,
        "server_url": url,
        "allowed_tools": allowed,
        "require_approval": approval,
        "headers": headers,
    }


def wire_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """How a tool is echoed in ``session.updated``: an MCP tool's header values are never sent back."""
    if tool["type"] != "mcp":
        return tool
    return {**tool, "headers": dict.fromkeys(tool["headers"], "<redacted>")}


def check_type_change(new: SessionSettings, busy: bool) -> None:
    """A session becomes a transcription session only while no response is in progress."""
    if not new.answers and busy:
        raise SessionError(
            "A response is in progress; cancel it before making this a transcription session",
            "conversation_already_has_active_response",
            "session.type",
        )
