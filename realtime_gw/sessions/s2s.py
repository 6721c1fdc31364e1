"""A realtime session bound to a speech-to-speech model (Moshi): the model listens and speaks at once,
one step per 80 ms, and its continuous output becomes Realtime responses. Pure.

Not a second session: a mode of ``RealtimeSession``, as transcription is. The input buffer, server
VAD, the user's turns and their transcripts (the ASR stage beside the model), items, truncation and
the response lifecycle are the same code; what differs is where a response comes from. This module
holds what does:

- **Binding.** A session whose model name is the stage's (``S2sSpec.model``, or the family the
  gateway serves it as) is bound to the stage when it connects (``S2sBinding``); its stream is opened
  first (``OpenS2s``) and holds a slot for the session's whole life; a full stage refuses the session
  at once (``S2sRefused``: ``server_busy``, then close 1013), never queued.
- **Input.** Every appended chunk is resampled to the model's rate and cut into frames (``S2sAudio``,
  80 ms each). The stage steps every conversation once per 80 ms on its own clock, whatever the client
  sends: a frame not there at its step is heard as silence, and quiet frames are dropped from an input
  that fell behind (``models/lockstep.py``), so the model, and its voice, never stops.
- **Output.** A response opens at the first step whose text token is not padding and closes
  (generation done; ``response.done`` once its audio has left) after ``end_ms`` of steps that are
  padding *and* quiet (below ``silence_dbfs``). Every step of an open response is an
  ``response.output_audio.delta`` (80 ms, resampled to 24 kHz if the model's rate differs) and its text
  piece a transcript delta placed at that step's audio, so a truncation keeps exactly the words whose
  step was heard. Steps outside a response (the model quiet, or forced silent) are not sent.
- **Hold.** ``response.cancel``, a truncation of the live reply and barge-in cancel the response and
  force the model's own channels silent (``S2sSilence(True)``) without dropping its context; the end
  of the user's next turn (a VAD stop or a commit) releases it, so the model may answer.
- **Prompt.** A model that takes a prompt (PersonaPlex: capabilities ``persona`` and ``voice_prompt``)
  gets the session's ``instructions`` as its persona and ``audio.output.voice`` (a name of
  ``S2sSpec.voices``, or ``{"id": name}``; ``default``: the stage's default voice) as its voice prompt.
  Both are prefilled when the stream opens, so the stream opens at connect with what the session has
  then (a client secret's or a call's config, GPT-Live's ``session.start``), and a later
  ``session.update`` that changes either re-opens it (``OpenS2s(reopen=True)``): the old conversation
  ends, a new one opens in its place with the new prompt, and the model's context starts over (a reply
  being said is cancelled). That update's ``session.updated`` is sent once the new stream is open, so
  everything after it is the new prompt's. A prompt the stage finds too long for its budget
  (``max_prompt_frames``; it counts the persona's tokens) is refused there (``S2sRefused(prompt=True)``):
  the old stream goes on, an ``error`` names the budget and a ``session.updated`` shows the prompt
  still applied (the update's other settings stand). A persona with more words than the budget has
  frames is refused here, before anything changes (each word is a token at least). A custom voice (the
  key's own, ``OwnVoices``) is looked up in the gateway's library when a stream opens: one deleted since
  is refused as an unknown voice by an update that would re-open with it, while the conversation open
  with it keeps its prompt until it ends.
- **Refusals.** What the model cannot take (instructions, tools, text input, ``response.create``,
  text-only output, another voice or speed) is refused with an error naming its capabilities.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from msgspec import UNSET

from realtime_gw.protocols import audio
from realtime_gw.protocols import realtime as rt
from realtime_gw.records.s2s import S2sAudio, S2sFrame, S2sOpen, S2sSilence, S2sSpec, VoiceCodes
from realtime_gw.records.voice import OUTPUT_RATE, TtsFrame
from realtime_gw.sessions.conversation import ConversationError, SpokenSpan
from realtime_gw.sessions.events import Effect, OpenS2s, ResponseAudio, ResponseFinished
from realtime_gw.sessions.response_lifecycle import Phase, Responses
from realtime_gw.sessions.response_state import LiveResponse
from realtime_gw.sessions.settings import SessionError, SessionSettings, check_voice

MAX_WAITING_FRAMES = 64
"""Steps kept while the previous response's audio is still leaving (~5 s; it leaves within the
transport's audio lead): the next response begins with them."""


@dataclass(frozen=True, slots=True)
class ReplyRule:
    """When a model's continuous output is a reply (the gateway's ``s2s_*`` settings of the realtime
    section)."""

    end_ms: float = 640.0
    silence_dbfs: float = -45.0


OwnVoices = Callable[[], Mapping[str, VoiceCodes | str]]
"""The session's API key's own voices of the model (``/v1/audio/voices``), read from the gateway's library
in memory (no I/O) each time they are needed: each id's codes, which the opening that names it carries (the
stage keeps no custom voice), or why the voice cannot open there (its stored codes do not fit the stage's
codec: it is listed, and refused saying so). A voice deleted is gone from it at once."""


def no_own_voices() -> Mapping[str, VoiceCodes | str]:
    return {}


def same_prompt(a: S2sOpen, b: S2sOpen) -> bool:
    """Two openings give the model the same prompt (a voice's id names its codes: they never change)."""
    return (a.voice, a.persona) == (b.voice, b.persona)


@dataclass(frozen=True, slots=True)
class S2sBinding:
    """What binds a session to the speech-to-speech stage: the stage's description and the rule."""

    spec: S2sSpec
    rule: ReplyRule = field(default_factory=ReplyRule)
    seed: int | None = None
    """The model's sampling seed for this session (None: the stage's)."""
    own_voices: OwnVoices = no_own_voices
    """The session's API key's own voices of this model, as the library has them now (``OwnVoices``)."""

    @property
    def capabilities(self) -> str:
        return ", ".join(self.spec.capabilities)

    @property
    def takes_persona(self) -> bool:
        return "persona" in self.spec.capabilities

    @property
    def takes_voice(self) -> bool:
        return "voice_prompt" in self.spec.capabilities

    def voices(self) -> frozenset[str]:
        """The names ``audio.output.voice`` may give (``default``: the stage's default voice)."""
        return frozenset({*self.spec.voices, *self.own_voices(), "default"}) if self.takes_voice else frozenset({"default"})

    def unusable(self, voice: str) -> str | None:
        """Why the key's own ``voice`` cannot open on the stage (another codec's codes), or None."""
        own = self.own_voices().get(voice) if self.takes_voice else None
        return own if isinstance(own, str) else None

    def request(self, settings: SessionSettings) -> S2sOpen:
        """The opening of the session's stream: its seed, and the prompt its settings give."""
        persona = settings.instructions.strip() if self.takes_persona else ""
        voice = settings.voice if self.takes_voice and settings.voice != "default" else None
        own = self.own_voices().get(voice) if voice is not None else None
        custom = own if isinstance(own, VoiceCodes) else None
        return S2sOpen(seed=self.seed, voice=voice, persona=persona or None, custom_voice=custom)


def refusal(b: S2sBinding, what: str, param: str | None, code: str = "unsupported_value") -> SessionError:
    """The error for something the model cannot take, naming what it can."""
    return SessionError(
        f"Model '{b.spec.model}' cannot take {what}: it is a speech-to-speech model that listens and speaks "
        f"on its own (capabilities: {b.capabilities})",
        code,
        param,
    )


def check_update(b: S2sBinding, p: rt.SessionParams) -> None:
    """Refuse the parts of a ``session.update`` the model cannot take; raises before anything changes."""
    if p.type == "transcription":
        raise refusal(b, "a change to a transcription session", "session.type")
    if p.instructions not in (UNSET, None, "") and not b.takes_persona:
        raise refusal(b, "instructions", "session.instructions")
    if b.takes_persona and isinstance(p.instructions, str):
        check_persona(b, p.instructions)
    if p.prompt not in (UNSET, None):
        raise refusal(b, "a prompt", "session.prompt")
    if p.tools not in (UNSET, None) and p.tools:
        raise refusal(b, "tools", "session.tools")
    if p.tool_choice not in (UNSET, None, "auto", "none"):
        raise refusal(b, "a tool choice", "session.tool_choice")
    if p.output_modalities not in (UNSET, None) and "audio" not in p.output_modalities:  # type: ignore[operator]
        raise refusal(b, "text-only output (it always speaks)", "session.output_modalities")
    if p.max_output_tokens not in (UNSET, None, "inf"):
        raise refusal(b, "max_output_tokens (it speaks until it is done)", "session.max_output_tokens")
    out = p.audio.output if p.audio not in (UNSET, None) else None  # type: ignore[union-attr]
    if out in (UNSET, None):
        return
    voice = out.voice.id if isinstance(out.voice, rt.VoiceId) else out.voice  # type: ignore[union-attr]
    if voice not in (UNSET, None, "default") and not b.takes_voice:  # else checked as the model's voices
        raise refusal(b, f"voice '{voice}' (it speaks in its own voice)", "session.audio.output.voice")
    if isinstance(voice, str) and (why := b.unusable(voice)) is not None:
        raise SessionError(f"Voice '{voice}' cannot be used with model '{b.spec.model}': {why}", "invalid_value",
                           "session.audio.output.voice")  # fmt: skip
    if out.speed not in (UNSET, None, 1.0):  # type: ignore[union-attr]
        raise refusal(b, "another speed", "session.audio.output.speed")


def check_persona(b: S2sBinding, persona: str) -> None:
    """Refuse a persona that cannot fit the prompt budget: every word is one token (one frame) at
    least. The exact count (the model's tokenizer, with the voice prompt) is the stage's."""
    words = len(persona.split())
    if words > b.spec.max_prompt_frames:
        raise SessionError(
            f"The persona (instructions) of model '{b.spec.model}' is too long: {words} words, one 80 ms prompt "
            f"frame each at least; its prompt budget is {b.spec.max_prompt_frames} frames for the voice prompt "
            "and the persona together",
            "string_above_max_length",
            "session.instructions",
        )


class SpokenResponses(Responses):
    """The response slot of a session whose model speaks on its own: a response opens already
    generating (no worker is asked: the model's stream runs), its transcript is the model's own text
    pieces, each placed at the audio of the step that said it, and ending one early forces the model
    silent (``held``) until the user's next turn ends."""

    held = False
    """The model's channels are forced silent (``S2sSilence(True)`` is in effect)."""

    def open_spoken(self, settings: SessionSettings) -> list[Effect]:
        """The model began to say something: a response in the conversation, generating."""
        r = LiveResponse(
            id=self.ids.new("resp"),
            epoch=self.epoch + 1,
            item_id=self.ids.new("item"),
            audio=True,
            in_conversation=True,
            conversation_id=self.conversation_id,
            voice=settings.voice,
        )
        return self.open(r, settings, generating=True)  # raises ConversationError, nothing changed

    def answer(self, settings: SessionSettings, p: rt.ResponseParams | None = None) -> list[Effect]:
        """A user turn asks for no response here: the model answers on its own, when it speaks."""
        return []

    def say(self, pcm: bytes, piece: str, now: float) -> list[Effect]:
        """One step of the live response: its text piece (placed at the step's audio), then its audio."""
        r = self.live
        assert r is not None and self.phase is Phase.GENERATING
        out: list[Effect] = []
        delta = piece if r.text else piece.lstrip()
        if delta:
            new_word = not r.spans or piece[:1].isspace()
            if not new_word and not r.spans[-1].text:
                r.spans.pop()  # the word goes on after padding
            if new_word:
                r.spans.append(SpokenSpan(r.audio_ms, delta.strip()))  # a word starts at this step
            else:
                r.spans[-1].text += delta
            r.text += delta
            out.append(self._send(r, rt.ResponseAudioTranscriptDeltaEvent(**r.ref(), delta=delta)))
        elif r.spans and r.spans[-1].text:
            r.spans.append(SpokenSpan(r.audio_ms, ""))  # the word ends where padding begins
        return out + self.on_audio(ResponseAudio(r.id, r.epoch, TtsFrame(pcm)), now)

    def end_spoken(self, settings: SessionSettings, now: float) -> list[Effect]:
        """The model stopped saying something: generation is done (``response.done`` when delivered)."""
        r = self.live
        assert r is not None
        return self.on_finished(ResponseFinished(r.id, r.epoch), settings, now)

    def cancel(self, reason: str) -> list[Effect]:
        """Ending a reply early also silences the model, without dropping its context."""
        return [*super().cancel(reason), *self.hold()]

    def hold(self) -> list[Effect]:
        if self.held or self.phase is Phase.CLOSED:
            return []
        self.held = True
        return [S2sSilence(True)]

    def release(self) -> list[Effect]:
        if not self.held or self.phase is Phase.CLOSED:
            return []
        self.held = False
        return [S2sSilence(False)]


class SpeechToSpeech:
    """The session's side of its stream on the speech-to-speech stage: the input clock and framing,
    and the model's steps turned into responses."""

    def __init__(self, binding: S2sBinding, responses: SpokenResponses) -> None:
        self.binding = binding
        self.spec = binding.spec
        self.rule = binding.rule
        self.responses = responses
        self.open = False
        """The stream is open: appended audio goes to the model."""
        self.frame_bytes = 2 * self.spec.native_rate * self.spec.frame_ms // 1000
        self.framer = audio.Reframer(self.frame_bytes // 2)
        self.to_model: audio.StreamingResampler | None = None
        self.from_model = audio.StreamingResampler(self.spec.native_rate, OUTPUT_RATE)
        self.quiet_ms = 0.0
        """How long the live response's steps have been padding and quiet."""
        self.waiting: list[tuple[S2sFrame, bytes]] = []
        """Steps that began a reply while the previous response's audio was still leaving."""
        self.steps_in = 0
        self.steps_out = 0
        self.finishing = False
        """The session is closing: the reply being said ends as it would, no new one opens."""
        self.applied: tuple[S2sOpen, str, str] | None = None
        """The opening of the stream that is open (or opening), with the instructions and voice it
        came from (what a refused new prompt returns the settings to)."""
        self.reopening: tuple[S2sOpen, str, str] | None = None
        """A new prompt the transport is opening the stream with (``OpenS2s(reopen=True)``)."""
        self.echoes: list[Effect] = []
        """The ``session.updated`` of the updates that re-open: sent once the stream has their prompt."""
        self.queued: SessionSettings | None = None
        """Settings of a later prompt change, opened once the re-open under way has answered."""
        self.queued_echoes: list[Effect] = []

    def capabilities(self) -> dict[str, Any]:
        """The session's additive ``capabilities``: what the model takes, its step and its context."""
        spec = self.spec
        out: dict[str, Any] = {
            "speech_to_speech": True,
            "model_capabilities": list(spec.capabilities),
            "chunk_period_ms": spec.frame_ms,
            "context_frames": spec.context_frames,
        }
        if self.binding.takes_voice or self.binding.takes_persona:
            out |= {"voices": list(spec.voices), "default_voice": spec.default_voice, "max_prompt_frames": spec.max_prompt_frames}
        return out

    def check(self, event: object) -> None:
        """Refuse a client event the model cannot take (``SessionError``), before anything changes."""
        b = self.binding
        if isinstance(event, rt.SessionUpdateEvent):
            check_update(b, event.session)
        elif isinstance(event, rt.ConversationItemCreateEvent):
            raise refusal(b, "conversation items (text, audio or tool output)", "item", "unsupported_event")
        elif isinstance(event, rt.ResponseCreateEvent):
            raise refusal(b, "response.create (a response opens when it starts to speak)", None, "unsupported_event")

    def finish(self) -> None:
        """The session is closing (GPT-Live's ``session.close``): what the model is saying ends as it
        would, and no new reply opens, so the close waits for one reply at most."""
        self.finishing = True

    def start(self, settings: SessionSettings) -> list[Effect]:
        """The session connected: open its stream, with the prompt its settings give (nothing else
        happens before it is open)."""
        self.applied = (self.binding.request(settings), settings.instructions, settings.voice)
        return [OpenS2s(self.applied[0], self.binding.spec.model)]

    def reprompt(self, settings: SessionSettings, echo: list[Effect]) -> list[Effect]:
        """After a ``session.update`` (``echo``: its ``session.updated``): a changed persona or voice
        re-opens the stream with it, and the echo waits for the new stream, so from the echo on the
        client hears the new prompt."""
        if self.reopening is not None:  # one re-open at a time: the newest change goes next
            self.queued = settings
            self.queued_echoes += echo
            return []
        want = self.binding.request(settings)
        if self.applied is None or same_prompt(want, self.applied[0]):
            return echo
        self.reopening = (want, settings.instructions, settings.voice)
        self.echoes = echo
        return [OpenS2s(want, self.binding.spec.model, reopen=True)]

    def check_prompt(self, settings: SessionSettings) -> None:
        """Refuse, before anything changes, an update that would re-open the stream (a new persona) with a
        custom voice its key has deleted since, as an unknown voice is refused: the conversation that is
        open keeps the prompt it opened with until it ends, but no new one opens with the voice."""
        want = self.binding.request(settings)
        latest = self.reopening or self.applied
        if want.voice is None or want.custom_voice is not None or want.voice in self.spec.voices:
            return
        if latest is None or not same_prompt(want, latest[0]):
            check_voice(want.voice, self.binding.voices(), "session.audio.output.voice")

    def opened(self, settings: SessionSettings) -> list[Effect] | None:
        """The stream is open. None: the first opening; else a re-open, whose new conversation
        starts from nothing: a reply of the old one is cancelled, a hold of it lifted, and the
        updates that asked for it are echoed."""
        self.open = True
        if self.reopening is None:
            return None
        self.applied, self.reopening = self.reopening, None
        r = self.responses
        out = Responses.cancel(r, "client_cancelled") if r.live is not None else []  # no hold: a new stream
        r.held = False  # the new conversation was never forced silent
        self.waiting.clear()
        self.quiet_ms = 0.0
        self.from_model = audio.StreamingResampler(self.spec.native_rate, OUTPUT_RATE)
        out += self.echoes
        queued, echoes, self.queued, self.queued_echoes, self.echoes = self.queued, self.queued_echoes, None, [], []
        return out + (self.reprompt(queued, echoes) if queued is not None else [])

    def prompt_refused(self, settings: SessionSettings) -> bool:
        """The stage refused a prompt (too long for its budget). True: it was a re-open, the old stream
        goes on and ``settings`` are returned to its prompt (the refused updates' echoes give way to
        one ``session.updated`` of that); False: the first opening (the session ends)."""
        if self.reopening is None or self.applied is None:
            return False
        self.reopening = self.queued = None
        self.echoes, self.queued_echoes = [], []
        _, settings.instructions, settings.voice = self.applied
        return True

    # -- input -----------------------------------------------------------------------------------------
    def hear(self, pcm: bytes, rate: int) -> list[Effect]:
        """Appended audio (PCM16 at the session's input rate) as the model's steps."""
        if not self.open:
            return []
        if self.to_model is None or self.to_model.in_rate != rate:
            self.to_model = audio.StreamingResampler(rate, self.spec.native_rate)
        frames = self.framer.push(self.to_model.push(pcm))
        self.steps_in += len(frames)
        return [S2sAudio(f) for f in frames]

    # -- output ----------------------------------------------------------------------------------------
    def on_frame(self, frame: S2sFrame, settings: SessionSettings, now: float) -> list[Effect]:
        """One step of the model: opens, continues or ends a response, or is not a reply at all."""
        self.steps_out += 1
        return self._step(frame, self.from_model.push(frame.pcm), settings, now)

    def _step(self, frame: S2sFrame, pcm: bytes, settings: SessionSettings, now: float) -> list[Effect]:
        r = self.responses
        if r.held or r.phase is Phase.CLOSED:
            self.waiting.clear()
            return []  # forced silent: what it still says (steps made before the hold) is not sent
        if r.phase is Phase.DELIVERING:
            if self.waiting or not frame.padding:  # the next reply began before the last one left
                # past the bound the newest steps go: the next reply keeps its beginning
                self.waiting = [*self.waiting, (frame, pcm)][:MAX_WAITING_FRAMES]
            return []
        if self.waiting:
            return self.resume(settings, now) + self._step(frame, pcm, settings, now)
        out: list[Effect] = []
        if r.phase is Phase.IDLE:
            if frame.padding or self.finishing:
                self.waiting.clear()
                return []
            try:
                out += r.open_spoken(settings)
            except ConversationError as e:  # a full conversation (truncation disabled): said once a turn
                return [r.ids.error(str(e), e.code, e.param), *r.hold()]
            self.quiet_ms = 0.0
        out += r.say(pcm, "" if frame.padding else frame.text, now)
        quiet = frame.padding and audio.level_dbfs(pcm) <= self.rule.silence_dbfs
        self.quiet_ms = self.quiet_ms + self.spec.frame_ms if quiet else 0.0
        if self.quiet_ms >= self.rule.end_ms:
            out += r.end_spoken(settings, now)
        return out

    def resume(self, settings: SessionSettings, now: float) -> list[Effect]:
        """The last response is done: the steps that waited for it begin the next one."""
        if self.responses.phase is not Phase.IDLE or not self.waiting:
            return []
        steps, self.waiting = self.waiting, []
        out: list[Effect] = []
        for frame, pcm in steps:
            out += self._step(frame, pcm, settings, now)
        return out
