"""Plain records of the speech-to-speech (full-duplex) stage: what a duplex session sends a model that
listens and speaks at once, one 80 ms step at a time, and what each step says (no torch, no I/O)."""

from __future__ import annotations

import msgspec


class VoiceCodes(msgspec.Struct, frozen=True):
    """A voice prompt made at run time (``/v1/audio/voices`` with a speech-to-speech model): the codec codes
    its stage encoded from the sample, one row per 80 ms frame, and that codec's card. The front-end's voice
    library keeps them; the stage keeps nothing, so any replica of it can open a conversation with them."""

    codes: tuple[tuple[int, ...], ...]
    card: int


class S2sOpen(msgspec.Struct, frozen=True, kw_only=True):
    """Open one duplex conversation on the speech-to-speech stage (it holds a slot for its whole life)."""

    seed: int | None = None
    """Sampling seed (None: from the stage's seed setting / random)."""
    voice: str | None = None
    """PersonaPlex: a voice of ``S2sSpec.voices`` (None: ``S2sSpec.default_voice``), or the id of a custom
    voice (then ``custom_voice`` holds it); Moshi: must be None."""
    custom_voice: VoiceCodes | None = None
    """The codes of ``voice`` when it is a custom voice: the gateway fills them from its library for the
    API key that made the voice (a client never gives them)."""
    persona: str | None = None
    """PersonaPlex: its text persona, a session's ``instructions`` (None or blank: none); Moshi: must be
    None. Both are prefilled when the conversation opens: changing them means opening another."""


class S2sAudio(msgspec.Struct, frozen=True):
    """One 80 ms step of the user's audio: PCM16 mono at the stage's native rate (Moshi: 24 kHz, 1920
    samples = 3840 bytes)."""

    pcm: bytes


class S2sSilence(msgspec.Struct, frozen=True):
    """Force (True) or release (False) the model's own output channels to silence (its text stream to
    padding, its audio to the silence codes) from the next step on, without dropping its context:
    response.cancel and barge-in."""

    silent: bool


class S2sFrame(msgspec.Struct, frozen=True, kw_only=True):
    """What one step said: one per S2sAudio input, in order."""

    index: int
    """The stream's step number (0-based); index*80 ms is its time on the stream clock."""
    pcm: bytes
    """The model's voice for this step, 80 ms PCM16 mono at the native rate."""
    text: str
    """The text piece the model emitted at this step, "" when its text token is padding."""
    text_token: int
    """Raw text token id (padding/epad ids are in ``BackendInfo.s2s``)."""
    padding: bool
    """The text token was padding (or end-of-padding) rather than a word piece."""
    late_ms: float = 0.0
    """How long after its deadline on the stage's 80 ms lockstep its audio was ready: the step that made
    it was due at a tick and had until the next (0: on time, or a stage not in lockstep). A late start
    (the step before ran over, the stage was busy, a prompt's prefill) counts as much as a long step."""


class S2sSpec(msgspec.Struct, frozen=True):
    """What a speech-to-speech backend is (``BackendInfo.s2s``): the session is built from it."""

    model: str
    """The family, e.g. ``moshi``."""
    frame_ms: int = 80
    """One step's length of audio, in and out."""
    native_rate: int = 24000
    """The rate of the PCM it takes and gives (Hz)."""
    context_frames: int = 3000
    """Steps its attention sees (a ring: older steps are forgotten, the stream goes on)."""
    text_padding_ids: tuple[int, ...] = ()
    """Text token ids that mean padding / end of padding (not a word piece)."""
    capabilities: tuple[str, ...] = ("audio_in", "audio_out", "text_out")
    """What the model can take and give (PersonaPlex adds ``voice_prompt`` and ``persona``: a session
    opens with ``S2sOpen.voice`` and ``S2sOpen.persona``, its instructions, prefilled at open)."""
    voices: tuple[str, ...] = ()
    """The voice prompts ``S2sOpen.voice`` may name (PersonaPlex's voice store)."""
    default_voice: str | None = None
    """The voice of a conversation opened without one (None: no voice prompt)."""
    max_prompt_frames: int = 0
    """Frames a voice prompt and a persona may take together (0: the model takes no prompt)."""
    voice_card: int = 0
    """The codec card of its voice prompts' codes: a custom voice (``VoiceCodes``) of another card was made by
    another codec and is refused (0: the model takes no voice prompt)."""
    voice_codebooks: int = 0
    """The codes a frame of its voice prompts has (its codec's codebooks; 0: the model takes no voice prompt)."""
