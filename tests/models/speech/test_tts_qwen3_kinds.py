"""Qwen3-TTS VoiceDesign and Base checkpoints (and CustomVoice ``instruct``) against the reference package.

``tests/fixtures/qwen3_tts_tiny_voice_design``, ``qwen3_tts_tiny_base``, ``qwen3_tts_tiny_clone.wav`` and
``qwen3_tts_tiny_kinds_ref.npz`` come from ``tests/fixtures/make_qwen3_tts.py kinds`` (``qwen-tts`` 0.1.1,
random weights): the reference's ``generate`` codes for instruct prompts and an x-vector clone, and the
clone WAV's log-mels and x-vector from its ``extract_speaker_embedding``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
import torch

from realtime_gw.models.speech.qwen3.checkpoint import Qwen3TtsCheckpoint, load_checkpoint
from realtime_gw.models.speech.qwen3.engine import Qwen3Engine, build_prompt
from realtime_gw.models.speech.qwen3.speaker import log_mel, mel_filterbank, speaker_embedding
from realtime_gw.models.speech.qwen3.talker import Sampling
from realtime_gw.models.speech.tts_qwen3 import Qwen3TtsBackend
from realtime_gw.records.voice import TtsRequest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
CLONE_WAV = FIXTURES / "qwen3_tts_tiny_clone.wav"
INSTRUCT = "A warm, low voice, speaking slowly."  # make_qwen3_tts.INSTRUCT


@pytest.fixture(scope="module")
def ref() -> Any:
    return np.load(FIXTURES / "qwen3_tts_tiny_kinds_ref.npz")


@pytest.fixture(scope="module")
def design() -> Qwen3TtsCheckpoint:
    return load_checkpoint(FIXTURES / "qwen3_tts_tiny_voice_design", "cpu", torch.float32)


@pytest.fixture(scope="module")
def base() -> Qwen3TtsCheckpoint:
    return load_checkpoint(FIXTURES / "qwen3_tts_tiny_base", "cpu", torch.float32)


@pytest.fixture(scope="module")
def custom() -> Qwen3TtsCheckpoint:
    return load_checkpoint(FIXTURES / "qwen3_tts_tiny", "cpu", torch.float32)


def _clone_vector(base: Qwen3TtsCheckpoint) -> tuple[float, ...]:
    assert base.speaker_encoder is not None
    wav, rate = soundfile.read(CLONE_WAV, dtype="float32")
    assert rate == 24000
    return tuple(speaker_embedding(base.speaker_encoder, wav).tolist())


def _codes(ck: Qwen3TtsCheckpoint, ref: Any, seed: int, do_sample: bool, **prompt: Any) -> np.ndarray:
    """Our engine's codes for the reference's text (streaming mode, 23 frames) under ``seed``."""
    ids = [int(x) for x in ref["text_ids"]]
    role, text = ids[:3], ids[3:-5]
    sampling = Sampling.from_generation(ck.generation, do_sample=do_sample, sub_do_sample=do_sample)
    eng = Qwen3Engine(ck, 2, max_positions=96, sampling=sampling, cuda_graphs=False)
    slot = eng.alloc_prompt(build_prompt(ck, role, **prompt))
    torch.manual_seed(seed)
    got = []
    for k in range(23):  # the reference ran max_new_tokens=24 and emitted no EOS: it keeps 23 frames
        tok = (
            text[k]
            if k < len(text)
            else ck.config["tts_eos_token_id" if k == len(text) else "tts_pad_token_id"]
        )
        codes, _ = eng.step([slot], [tok], [k >= 2])
        got.append(codes[0])
    return np.stack(got)


# -- VoiceDesign, CustomVoice instruct -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("case", "language", "do_sample", "seed", "instruct"),
    [
        ("design_greedy_english", "english", False, 0, True),
        ("design_topk_auto", "auto", True, 99, True),
        ("design_greedy_no_instruct", "english", False, 0, False),
    ],
)
def test_voice_design_codes_equal_reference(
    design: Qwen3TtsCheckpoint, ref: Any, case: str, language: str, do_sample: bool, seed: int, instruct: bool
) -> None:
    """The voice description rides ahead of the prompt as text-only positions, as the reference's
    ``generate(instruct_ids=...)`` puts it: same codes, greedy and top-k under the same seed."""
    ids = tuple(int(x) for x in ref["instruct_ids"]) if instruct else ()
    want = ref[f"codes_{case}"]
    assert want.shape == (23, 16)
    got = _codes(design, ref, seed, do_sample, speaker=None, language=language, instruct_ids=ids)
    assert np.array_equal(got, want)


def test_custom_voice_instruct_codes_equal_reference(custom: Qwen3TtsCheckpoint, ref: Any) -> None:
    ids = tuple(int(x) for x in ref["instruct_ids"])
    assert custom.takes_instruct()  # "tiny" is not a 0.6B size: the reference passes the instruct on
    got = _codes(custom, ref, 3, True, speaker="ryan", language="english", instruct_ids=ids)
    assert np.array_equal(got, ref["codes_custom_instruct_ryan"])


def test_custom_voice_instruct_only_past_0_6b(custom: Qwen3TtsCheckpoint, design: Qwen3TtsCheckpoint) -> None:
    """The reference drops a CustomVoice instruct when ``tts_model_size in "0b6"`` (the 0.6B models)."""
    import dataclasses

    def sized(ck: Qwen3TtsCheckpoint, size: str) -> Qwen3TtsCheckpoint:
        return dataclasses.replace(ck, config={**ck.config, "tts_model_size": size})

    assert not sized(custom, "0b6").takes_instruct() and not sized(custom, "0.6b").takes_instruct()
    assert sized(custom, "1b7").takes_instruct() and sized(design, "0b6").takes_instruct()


def test_instruct_tokens_equal_reference(design: Qwen3TtsCheckpoint, ref: Any) -> None:
    """The backend tokenizes a description as the reference's ``_build_instruct_text`` does."""
    backend = Qwen3TtsBackend(checkpoint=design, slots=1, max_positions=128, cuda_graphs=False)
    assert backend.instruct_ids(INSTRUCT) == tuple(int(x) for x in ref["instruct_ids"])
    assert backend.instruct_ids("") == () and backend.instruct_ids(None) == ()


# -- Base: speaker encoder and x-vector clone -----------------------------------------------------------------
def test_log_mel_and_xvector_equal_reference(base: Qwen3TtsCheckpoint, ref: Any) -> None:
    """The clone WAV's 128 Slaney log-mels (our filterbank, no librosa) and the ECAPA-TDNN x-vector
    (``speaker_encoder.*`` loaded strictly) equal the reference's ``extract_speaker_embedding``."""
    wav, _ = soundfile.read(CLONE_WAV, dtype="float32")
    mel = log_mel(torch.from_numpy(wav)).T.numpy()
    assert mel.shape == ref["clone_mel"].shape
    assert np.abs(mel - ref["clone_mel"]).max() <= 1e-5
    vec = np.asarray(_clone_vector(base), dtype=np.float32)
    want = ref["clone_xvector"]
    assert vec.shape == want.shape == (base.talker_config["hidden_size"],)
    assert np.abs(vec - want).max() <= 1e-5 * max(1.0, float(np.abs(want).max()))
    fb = mel_filterbank(24000, 1024, 128, 0.0, 12000.0)
    assert fb.dtype == np.float32 and fb.shape == (128, 513) and (fb.sum(axis=1) > 0).all()


@pytest.mark.parametrize(
    ("case", "language", "do_sample", "seed"),
    [("clone_greedy_english", "english", False, 0), ("clone_topk_auto", "auto", True, 5)],
)
def test_clone_codes_equal_reference(
    base: Qwen3TtsCheckpoint, ref: Any, case: str, language: str, do_sample: bool, seed: int
) -> None:
    """x-vector-only cloning: the vector sits where a CustomVoice speaker's codec embedding would."""
    vec = _clone_vector(base)
    got = _codes(base, ref, seed, do_sample, speaker=None, language=language, vector=vec)
    assert np.array_equal(got, ref[f"codes_{case}"])


def test_prompt_takes_speaker_or_vector(custom: Qwen3TtsCheckpoint) -> None:
    with pytest.raises(ValueError, match="not both"):
        build_prompt(custom, [1, 2, 3], "ryan", "english", vector=(0.0,) * 32)


# -- the backend over each kind ------------------------------------------------------------------------------
def _backend(ck: Qwen3TtsCheckpoint, **kw: Any) -> Qwen3TtsBackend:
    return Qwen3TtsBackend(
        checkpoint=ck, slots=2, max_positions=128, cuda_graphs=False, max_frames_per_token=2,
        sampling=Sampling(do_sample=False, sub_do_sample=False), **kw,
    )  # fmt: skip


def test_voice_design_backend_instructions(design: Qwen3TtsCheckpoint) -> None:
    """A request's ``instructions`` is the voice's description; without one, the named design's or the
    server default's; different descriptions give different audio, the same one the same audio."""
    b = _backend(design, instructions="A bright, quick voice.", designs={"narrator": INSTRUCT})
    assert b.kind == "voice_design" and b.voices == ("narrator",)
    assert b.resolve_voice("alloy") == "default" and b.resolve_voice("narrator") == "narrator"
    text = "Hello there world."
    by_request = b.synthesize(text, TtsRequest(instructions=INSTRUCT))
    by_voice = b.synthesize(text, TtsRequest(voice="narrator"))
    by_default = b.synthesize(text, TtsRequest())
    assert len(by_request) > 0 and by_request == by_voice and by_default != by_request
    with pytest.raises(ValueError, match="instructions"):
        b.open(TtsRequest(instructions="word " * 200))


def test_base_backend_clones_registered_voices(base: Qwen3TtsCheckpoint) -> None:
    b = _backend(base, clones={"anna": str(CLONE_WAV)})
    assert b.kind == "base" and b.voices == ("anna",) and b.default_voice == "anna"
    assert b.resolve_voice("default") == "anna" and b.resolve_voice("alloy") == "anna"
    assert b.clones["anna"].vector == _clone_vector(base)
    assert len(b.synthesize("Hello there world.", TtsRequest(voice="anna"))) > 0
    bare = _backend(base)  # no start-up clones: voices come from /v1/audio/voices
    assert bare.voices == () and bare.default_voice == "default" and bare.resolve_voice("alloy") == "default"


def test_kind_mismatches_refused(custom: Qwen3TtsCheckpoint, design: Qwen3TtsCheckpoint) -> None:
    with pytest.raises(ValueError, match="Base"):
        _backend(custom, clones={"anna": str(CLONE_WAV)})
    with pytest.raises(ValueError, match="VoiceDesign"):
        _backend(custom, designs={"narrator": INSTRUCT})
    with pytest.raises(ValueError, match="Base"):
        _backend(design, clones={"anna": str(CLONE_WAV)})


def test_resampled_recording_xvector_equals_reference(base: Qwen3TtsCheckpoint, ref: Any) -> None:
    """A 16 kHz recording is resampled to 24 kHz as the reference does (soxr HQ, librosa's length)."""
    from realtime_gw.models.speech.qwen3.voices import clone_voice, read_clone_audio

    audio = read_clone_audio(str(FIXTURES / "qwen3_tts_tiny_clone_16k.wav"))
    assert audio.dtype == np.float32 and audio.shape == (14400,)
    voice = clone_voice(base, str(FIXTURES / "qwen3_tts_tiny_clone_16k.wav"), lambda text: [])
    assert not voice.icl
    vec = np.asarray(voice.vector, dtype=np.float32)
    want = ref["clone16_xvector"]
    assert np.abs(vec - want).max() <= 1e-5 * max(1.0, float(np.abs(want).max()))


def test_voice_specs_parse() -> None:
    from realtime_gw.models.speech.qwen3.voices import parse_voice_specs

    specs = parse_voice_specs(["Anna=/v/anna.wav", "bob = /v/b.wav:Hi: there"], "--tts-voice-clone")
    assert specs == {"anna": "/v/anna.wav", "bob": "/v/b.wav:Hi: there"}
    for bad in (["anna"], ["=x.wav"], ["anna="], ["a=1.wav", "A=2.wav"]):
        with pytest.raises(ValueError, match="--tts-voice-clone"):
            parse_voice_specs(bad, "--tts-voice-clone")


# -- Base: ICL (the recording's codes and transcript in the prompt) --------------------------------------------
def test_speech_encoder_codes_equal_reference(base: Qwen3TtsCheckpoint, ref: Any) -> None:
    """The 12 Hz tokenizer's encoder (``encoder.*`` into transformers' Mimi, names mapped) gives the
    reference's ``speech_tokenizer.encode`` codes for the clone WAV."""
    from realtime_gw.models.speech.qwen3.encoder import SpeechEncoder

    assert base.path is not None
    enc = SpeechEncoder.from_dir(base.path / "speech_tokenizer", base.codec_config)
    wav, _ = soundfile.read(CLONE_WAV, dtype="float32")
    assert np.array_equal(enc.encode(wav).numpy(), ref["icl_ref_code"])


def _icl_stream(
    base: Qwen3TtsCheckpoint, ref: Any, text_key: str, language: str, sampling: Sampling, seed: int
) -> tuple[list[np.ndarray], list[np.ndarray], Any]:
    """23 frames of an ICL clone (``path.wav:Hi.``) speaking the fixture's text, whole text known (as the
    reference had it), the decoder primed with the recording's codes: (codes, PCM, the clone)."""
    from realtime_gw.models.speech.qwen3.voices import clone_voice, icl_start
    from realtime_gw.models.tokenizers import HfTokenizer

    assert base.path is not None
    voice = clone_voice(base, f"{CLONE_WAV}:Hi.", HfTokenizer(base.path).encode)
    ids = [int(x) for x in ref[text_key]]
    role, text = ids[:3], ids[3:-5]
    cfg = base.config
    special = {"tts_eos": cfg["tts_eos_token_id"], "tts_pad": cfg["tts_pad_token_id"],
               "codec_bos": base.talker_config["codec_bos_id"]}  # fmt: skip
    head = build_prompt(base, role, None, language, vector=voice.vector)
    start = icl_start(voice, "anna", head, text, True, special)
    assert not start.prompt.cache and start.eos_in_prompt == (text_key == "short_text_ids")
    feed = [*start.lead, *text[start.consumed :], *([] if start.eos_in_prompt else [special["tts_eos"]])]
    eng = Qwen3Engine(base, 2, max_positions=96, sampling=sampling, cuda_graphs=False)
    eng.add_recording("anna", voice.frames, voice.codes)
    slot = eng.alloc_prompt(start.prompt)
    torch.manual_seed(seed)
    codes, pcm = [], []
    for k in range(23):
        c, a = eng.step([slot], [feed[k] if k < len(feed) else special["tts_pad"]], [k >= 2])
        codes.append(c[0])
        pcm.append(a[0])
    return codes, pcm, voice


@pytest.mark.parametrize(
    ("case", "text_key", "language", "do_sample", "seed"),
    [
        ("icl_greedy_english", "text_ids", "english", False, 0),  # the text runs past the recording
        ("icl_topk_auto", "text_ids", "auto", True, 8),
        ("icl_greedy_short", "short_text_ids", "english", False, 0),  # the text ends inside the prompt
    ],
)
def test_icl_codes_equal_reference(
    base: Qwen3TtsCheckpoint, ref: Any, case: str, text_key: str, language: str, do_sample: bool, seed: int
) -> None:
    """ICL cloning (``NAME=path.wav:transcript``): the transcript and text aligned with the recording's
    frames in the prompt, as the reference's streaming ``generate_icl_prompt``: same codes; and the
    waveform equals the reference's decode of recording + speech codes past the recording (greedy case)."""
    sampling = Sampling.from_generation(base.generation, do_sample=do_sample, sub_do_sample=do_sample)
    codes, pcm, voice = _icl_stream(base, ref, text_key, language, sampling, seed)
    assert voice.ref_ids == tuple(int(x) for x in ref["icl_ref_ids"][3:-2])
    assert np.array_equal(voice.codes.numpy(), ref["icl_ref_code"])
    assert np.array_equal(np.stack(codes), ref[f"codes_{case}"])
    if case == "icl_greedy_english":
        want = ref["icl_wav_full"][len(voice.frames) * 1920 :]
        got = np.concatenate(pcm).astype(np.float32) / 32768.0
        assert got.shape == want.shape and np.abs(got - want).max() <= 1e-4 + 1 / 32768


def test_icl_backend_waits_for_the_prompt_text(base: Qwen3TtsCheckpoint) -> None:
    """An ICL stream holds its slot and waits until the text its prompt takes has arrived; text given in
    pieces then speaks exactly as text given at once."""
    from realtime_gw.models.contract import END_OF_INPUT

    b = _backend(base, clones={"anna": f"{CLONE_WAV}:Hi."})
    assert b.clones["anna"].icl and b.voices == ("anna",)
    st = b.open(TtsRequest(voice="anna"))
    assert b.engine.free_slots == 1
    (first,) = b.step([(st, ["Hi "])])  # 2 tokens: the prompt takes 5 (8 frames - 3 transcript tokens)
    assert first.outputs == [] and not first.done and not b.has_work(st) and st.icl is not None
    (idle,) = b.step([(st, [])])
    assert idle.outputs == [] and st.icl is not None
    pcm = bytearray()
    inputs: list[Any] = ["Hello ", "there world.", END_OF_INPUT]
    while True:
        (r,) = b.step([(st, inputs)])
        inputs = []
        pcm += b"".join(f.pcm for f in r.outputs)
        if r.done:
            break
    b.release(st)
    assert st.icl is None and b.engine.free_slots == 2
    assert len(pcm) > 0
    again = b.synthesize("Hi Hello there world.", TtsRequest(voice="anna"))
    assert bytes(pcm) == again


def test_icl_clone_streams_keep_cached_voices(base: Qwen3TtsCheckpoint) -> None:
    """Warm-up caches the prompts streams start from (the x-vector clone's), not an ICL clone's head; ICL
    streams' per-utterance prompts then neither enter the full cache nor evict it: the x-vector voice's
    K/V stay the ones warm-up computed, and it speaks as before."""
    b = _backend(base, clones={"anna": f"{CLONE_WAV}:Hi.", "bob": str(CLONE_WAV)})
    b.engine.prompt_cache = 1
    bob = b._prompt("bob", None)
    assert b.voice_prompts() == [bob]
    b.warmup()  # its utterance is the default voice's: anna, an ICL clone
    kv = b.engine._prompt_kv[bob]
    assert list(b.engine._prompt_kv) == [bob]
    text = "Hello there world."
    before = b.synthesize(text, TtsRequest(voice="bob"))
    for words in ("Hi.", "Hello there.", "Good morning, world."):
        assert len(b.synthesize(words, TtsRequest(voice="anna"))) > 0
    assert list(b.engine._prompt_kv) == [bob] and b.engine._prompt_kv[bob] is kv
    assert b.synthesize(text, TtsRequest(voice="bob")) == before


def test_voice_design_warmup_prompts(design: Qwen3TtsCheckpoint) -> None:
    """Warm-up caches each named design's prompt, and the server's ``instructions`` alone only while that is
    the default voice (with a named default design, no request starts from it)."""
    kw = {"instructions": "A bright, quick voice.", "designs": {"narrator": INSTRUCT}}
    named = _backend(design, voice="narrator", **kw)
    assert named.voice_prompts() == [named._prompt("narrator", None)]
    plain = _backend(design, **kw)
    assert plain.voice_prompts() == [plain._prompt("narrator", None), plain._prompt("default", None)]
    assert plain._prompt("default", None) == plain._prompt("narrator", "A bright, quick voice.")
