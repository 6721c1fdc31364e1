"""``/v1/audio/voices`` and ``/v1/audio/voice_consents`` as the ``openai`` SDK calls them.

A voice is made by the TTS stage itself: the server decodes and checks the upload (in a thread), then
submits a ``VoiceRegistration`` to the TTS worker like any request; the backend computes what the voice
needs once (a Base checkpoint's x-vector; a VoiceDesign checkpoint keeps the description) and answers
with a ``VoiceAdded``, which the library keeps (``voice_library``). A TTS model that cannot make a kind
refuses it before anything is computed (its ``BackendInfo.voice_kinds``). At start-up every stored TTS voice
is registered again (``restore_voices``); ``voice: {"id": ...}`` in speech and realtime then names it,
for the key that made it only.

A create request whose ``model`` names the speech-to-speech stage's model (``personaplex``: a model
whose voice is a voice prompt) makes that model's voice instead: the same consent and sample checks, and
the sample brought to the prompt's loudness (-24 LUFS, in the same thread: a silent or sub-audible one is
a 400), then the ``VoiceRegistration`` goes to the speech-to-speech worker, which only encodes it into
the model's voice prompt (``models/s2s/voice_records.py``) and answers with its codes. The stage keeps
nothing: the library keeps the codes, and an opening of that model's realtime sessions whose
``audio.output.voice: {"id": ...}`` names the voice (the key's own only) carries them
(``S2sOpen.custom_voice``), so any replica of the stage (Ray) opens it, across restarts. At start a
stored voice the stage's codec cannot take (another card, codes of another width or out of range) is
reported and stays listed; a session naming it is refused saying why. The stage makes one voice at a
time (a registration holds a conversation slot until answered): a create request meanwhile is a 503
``server_busy`` with ``Retry-After``. Deleting such a voice is the library's alone, and sessions look the
key's voices up in the library when a stream opens: a conversation open with the voice keeps its prompt
until it ends, but none opens with it again (an update that would re-open with it is refused as an
unknown voice; a client secret naming it opens its session with the default voice, and an ``error``
after ``session.created`` says why). Voices being made count against ``max_voices_per_key``. The voice
object says its ``model``; ``GET ?model=`` lists one model's voices (the stage's by either name).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import msgspec
from starlette.datastructures import FormData, UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from realtime_gw.models.runtime import NoFreeSlot, RequestRefused, StageWorker, WorkerFault
from realtime_gw.protocols import voices as pv
from realtime_gw.records.s2s import S2sSpec
from realtime_gw.records.voice import VoiceAdded, VoiceRegistration, VoiceRemoval
from realtime_gw.server import auth
from realtime_gw.server.gateway import Gateway
from realtime_gw.server.s2s_link import S2S_FAMILIES, binding
from realtime_gw.server.speech import bounded_body, openai_error
from realtime_gw.server.voice_library import (
    StoredConsent,
    StoredVoice,
    owner_of,
    stored_voice_record,
)

log = logging.getLogger(__name__)

KIND_WORDS = {"audio_sample": "clone voices from recordings", "prompt": "design voices from a prompt"}
MAX_FORM_BYTES = pv.MAX_UPLOAD_BYTES + 64 * 1024
"""A create request's body: one recording and a few short fields."""
PROMPT_RETRY_AFTER_S = 2
"""``Retry-After`` of a create request refused while the speech-to-speech stage makes another voice (the
``openai`` SDK retries a 503 after it)."""


class _Refused(Exception):
    def __init__(self, response: Response) -> None:
        self.response = response


def _owner(request: Request) -> str:
    key = request.app.state.gateway.access.identify(auth.presented_key(request.headers))
    if key is None:
        raise _Refused(openai_error(401, "Invalid or missing API key", code="invalid_api_key"))
    return owner_of(key)


def _json(obj: Any) -> JSONResponse:
    return JSONResponse(msgspec.to_builtins(obj))


def _refusals(handler: Any) -> Any:
    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except _Refused as r:
            return r.response
        except pv.VoiceInputError as e:
            return openai_error(400, str(e), param=e.param, code=e.code)

    return endpoint


async def _form(request: Request) -> FormData | dict[str, Any]:
    """The body as multipart form data (what the SDK sends) or a JSON object, read up to ``MAX_FORM_BYTES``."""
    body = await bounded_body(request, MAX_FORM_BYTES)
    if body is None:
        raise _Refused(openai_error(413, f"Request body is over {MAX_FORM_BYTES} bytes", code="request_too_large"))
    if request.headers.get("content-type", "").startswith("application/json"):
        try:
            obj = msgspec.json.decode(body)
        except msgspec.DecodeError as e:
            raise _Refused(openai_error(400, f"Malformed JSON: {e}", code="invalid_json")) from None
        if not isinstance(obj, dict):
            raise _Refused(openai_error(400, "The body must be a JSON object", code="invalid_json"))
        return obj
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        return await Request(request.scope, replay).form(max_files=1, max_fields=16, max_part_size=64 * 1024)
    except Exception as e:  # starlette's MultiPartException, a missing boundary, a bad encoding
        raise _Refused(openai_error(400, f"Malformed form data: {e}", code="invalid_request")) from None


def _text(form: FormData | dict[str, Any], name: str) -> str | None:
    value = form.get(name)
    if value is None or isinstance(value, str):
        return value
    raise pv.VoiceInputError(f"{name} must be a text field", name)


async def _file(form: FormData | dict[str, Any], name: str) -> bytes:
    value = form.get(name)
    if not isinstance(value, UploadFile):
        raise pv.VoiceInputError(f"{name} is required (an audio file, multipart form data)", name,
                                 "missing_required_parameter")  # fmt: skip
    data = await value.read(pv.MAX_UPLOAD_BYTES + 1)
    if len(data) > pv.MAX_UPLOAD_BYTES:
        raise pv.VoiceInputError(f"{name} is over {pv.MAX_UPLOAD_BYTES} bytes", name, "file_too_large")
    return data


def _limit(request: Request) -> tuple[str | None, int]:
    raw = request.query_params.get("limit", "20")
    if not raw.isdigit():
        raise pv.VoiceInputError("limit must be an integer", "limit")
    return request.query_params.get("after"), int(raw)


# -- the stages ------------------------------------------------------------------------------------------
def _s2s_model(gateway: Gateway, model: str | None) -> str | None:
    """The speech-to-speech model a create request's ``model`` names (its voices are voice prompts), None
    for the TTS stage (no model, or another name, such as OpenAI's ``auto``); a 400 for a
    speech-to-speech model that takes no voice or is not served."""
    if not model:
        return None
    bound = binding(gateway.workers.s2s, gateway.config, model)
    if bound is not None and bound.takes_voice:
        return bound.spec.model
    if bound is not None:
        raise pv.VoiceInputError(f"Model '{model}' takes no voice prompt (capabilities: {bound.capabilities})",
                                 "model", "unsupported_value")  # fmt: skip
    if model in S2S_FAMILIES:
        raise pv.VoiceInputError(f"Model '{model}' is a speech-to-speech model this gateway does not serve",
                                 "model", "unsupported_value")  # fmt: skip
    return None


def _stage(gateway: Gateway, model: str | None) -> StageWorker | None:
    """The worker that makes and speaks a voice of ``model`` (None: the TTS stage), or None if this
    gateway does not serve that model now."""
    if model is None:
        return gateway.workers.tts  # type: ignore[no-any-return]
    bound = binding(gateway.workers.s2s, gateway.config, model)
    return gateway.workers.s2s if bound is not None and bound.takes_voice else None


def _listed_model(gateway: Gateway, model: str) -> str:
    """The model whose voices ``GET ?model=`` lists: the speech-to-speech stage's by any name a session
    may give it (``binding``: its own, or the family it is served as, e.g. ``personaplex``)."""
    bound = binding(gateway.workers.s2s, gateway.config, model) if model else None
    return bound.spec.model if bound is not None else model


def prompt_fault(v: StoredVoice, spec: S2sSpec) -> str | None:
    """Why a stored voice prompt cannot open on the stage ``spec`` describes, or None: codes of another
    codec's card (``VoiceCodes.card``), rows of another width, or codes out of the card's range (a file
    changed by hand, or a stage of another shape). Checked once at start, not at each opening."""
    if v.card != spec.voice_card:
        return (f"it was made by another codec (card {v.card}; this model's: card {spec.voice_card}): make the "
                "voice again from its sample")  # fmt: skip
    width = spec.voice_codebooks
    if not v.codes or any(not row or (width and len(row) != width) or min(row) < 0 or max(row) >= v.card
                          for row in v.codes):  # fmt: skip
        return (f"its stored codes do not fit this model's codec ({width} codebooks of card {v.card} a frame): "
                "make the voice again from its sample")  # fmt: skip
    return None


async def _register(worker: StageWorker, record: VoiceRegistration | VoiceRemoval) -> VoiceAdded | None:
    """The stage's answer to a voice record (None for a removal)."""
    stream = worker.submit(record)
    try:
        outputs = [x async for x in stream]
    finally:
        stream.cancel()
    added = [x for x in outputs if isinstance(x, VoiceAdded)]
    return added[0] if added else None


async def restore_voices(gateway: Gateway) -> None:
    """Register every stored voice of a kind this TTS model makes (from what it computed before: nothing
    is computed again); check that the speech-to-speech model's voices are of its codec (they need no
    registration: an opening carries their codes). Others stay listed but cannot be spoken (speech and
    the session name why)."""
    if not gateway.voices.voices:
        return
    kinds = gateway.workers.tts.describe().voice_kinds
    ok = 0
    for v in list(gateway.voices.voices.values()):
        worker = _stage(gateway, v.voice.model)
        if worker is None or (v.voice.model is None and v.voice.type not in kinds):
            continue
        if v.voice.model is not None:
            spec = worker.describe().s2s
            v.fault = "the stage describes no codec" if spec is None else prompt_fault(v, spec)
            v.usable = v.fault is None
            if v.fault is not None:
                log.warning("voices: %s cannot open on %s (sessions naming it are refused): %s", v.voice.id,
                            worker.name, v.fault)  # fmt: skip
            ok += v.usable
            continue
        try:
            await _register(worker, VoiceRegistration(v.voice.id, v.voice.type, **stored_voice_record(v)))
        except (NoFreeSlot, WorkerFault) as e:
            log.warning("voices: %s cannot be spoken by %s: %s", v.voice.id, worker.name, e)
            continue
        v.usable = True
        ok += 1
    log.info("voices: %d of %d stored voices usable (%s)", ok, len(gateway.voices.voices),
             gateway.workers.tts.name)  # fmt: skip


# -- /v1/audio/voices ----------------------------------------------------------------------------------
@_refusals
async def voices_endpoint(request: Request) -> Response:
    owner = _owner(request)
    gateway: Gateway = request.app.state.gateway
    if request.method == "GET":
        after, limit = _limit(request)
        voices = [v.voice for v in gateway.voices.voices_of(owner)]
        if "model" in request.query_params:  # one model's voices (the TTS stage's: ``model=``)
            model = _listed_model(gateway, request.query_params["model"])
            voices = [v for v in voices if (v.model or "") == model]
        return JSONResponse(pv.page(voices, after, limit))
    form = await _form(request)
    name = pv.check_name(_text(form, "name"))
    kind = _text(form, "type") or "audio_sample"
    if kind not in KIND_WORDS:
        raise pv.VoiceInputError("type must be 'audio_sample' or 'prompt'", "type")
    model = _s2s_model(gateway, _text(form, "model"))
    if model is not None and kind != "audio_sample":
        raise pv.VoiceInputError(f"Model '{model}' makes voices from audio samples only (its voice is a voice "
                                 "prompt: a recording of the voice)", "type", "unsupported_voice_type")  # fmt: skip
    info = gateway.workers.tts.describe()
    if model is None and kind not in info.voice_kinds:
        raise pv.VoiceInputError(f"this server's TTS model ({info.name}) cannot {KIND_WORDS[kind]}", "type",
                                 "unsupported_voice_type")  # fmt: skip
    lib = gateway.voices
    if lib.creations(owner) >= lib.max_per_key:  # the voices it is making count too
        raise pv.VoiceInputError(f"this API key has {lib.max_per_key} voices (made or being made), the most it "
                                 "may keep; delete one first", None, "voice_limit_reached")  # fmt: skip
    if model is not None and lib.making_prompt:  # a registration holds a conversation slot until answered
        busy = openai_error(503, f"Model '{model}' is busy making another voice; retry in a few seconds",
                            code="server_busy")  # fmt: skip
        busy.headers["Retry-After"] = str(PROMPT_RETRY_AFTER_S)
        return busy
    lib.making[owner] += 1
    lib.making_prompt = lib.making_prompt or model is not None
    try:
        return await _make(gateway, owner, form, name, kind, model)
    finally:
        lib.making[owner] -= 1
        if lib.making[owner] <= 0:
            del lib.making[owner]
        if model is not None:
            lib.making_prompt = False


async def _make(
    gateway: Gateway, owner: str, form: FormData | dict[str, Any], name: str, kind: str, model: str | None
) -> Response:
    """Make the voice a create request asks for, on its stage, and keep it: the voice object, or an error."""
    voice_id = gateway.voices.new_voice_id()
    consent = None
    if kind == "prompt":
        prompt = pv.check_prompt(_text(form, "prompt"))
        record = VoiceRegistration(voice_id, kind, description=prompt)
    else:
        consent = _text(form, "consent")
        if not consent or gateway.voices.consent(owner, consent) is None:
            raise pv.VoiceInputError(f"No consent recording '{consent}' for this API key (create one with "
                                     "POST /v1/audio/voice_consents)", "consent")  # fmt: skip
        data = await _file(form, "audio_sample")
        # decoding, and for a voice prompt its loudness (a few hundred ms for a long sample): off the loop
        check = pv.check_sample if model is None else pv.prompt_sample
        sample = await asyncio.to_thread(lambda: check(pv.decode_recording(data)))
        prompt = None
        record = VoiceRegistration(voice_id, kind, sample=sample)
    worker = _stage(gateway, model)
    assert worker is not None  # ``_s2s_model`` named a model served now
    try:
        added = await _register(worker, record)
    except NoFreeSlot as e:
        return openai_error(503, str(e), code="server_busy")
    except RequestRefused as e:
        return openai_error(400, str(e), param="prompt" if kind == "prompt" else "audio_sample")
    except WorkerFault as e:
        log.warning("voices: %s failed to make a voice: %s", worker.name, e)
        return openai_error(500, f"Making the voice failed: {e}", code="server_error")
    assert added is not None
    if consent is not None and gateway.voices.consent(owner, consent) is None:  # deleted while it was made
        if model is None:  # the TTS stage holds what it made: it forgets it (a speech-to-speech one kept none)
            with contextlib.suppress(NoFreeSlot, WorkerFault):
                await _register(worker, VoiceRemoval(voice_id))
        raise pv.VoiceInputError(f"The consent recording '{consent}' was deleted while the voice was made", "consent")
    obj = pv.VoiceObject(id=voice_id, created_at=int(time.time()), name=name, type=kind, prompt=prompt, model=model)  # type: ignore[arg-type]
    stored = StoredVoice(obj, owner, consent, added.vector, added.codes, added.card, usable=True)
    await gateway.voices.put_voice(stored)
    log.info("voices: made %s (%s%s)", voice_id, kind, f", {model}" if model else "")
    return _json(obj)


@_refusals
async def voice_endpoint(request: Request) -> Response:
    owner = _owner(request)
    gateway: Gateway = request.app.state.gateway
    voice_id = request.path_params["voice_id"]
    stored = gateway.voices.voice(owner, voice_id)
    if stored is None:
        return openai_error(404, f"No voice with id '{voice_id}'", param="voice_id", code="not_found")
    if request.method == "GET":
        return _json(stored.voice)
    await gateway.voices.drop_voice(voice_id)
    worker = _stage(gateway, None)  # a speech-to-speech stage keeps no voice: nothing to tell it
    if stored.usable and stored.voice.model is None and worker is not None:
        try:
            await _register(worker, VoiceRemoval(voice_id))
        except (NoFreeSlot, WorkerFault) as e:  # it is no longer listed, so no key can name it
            log.warning("voices: %s kept %s: %s", worker.name, voice_id, e)
    return _json(pv.VoiceDeleted(id=voice_id))


# -- /v1/audio/voice_consents ----------------------------------------------------------------------------
@_refusals
async def consents_endpoint(request: Request) -> Response:
    owner = _owner(request)
    gateway: Gateway = request.app.state.gateway
    if request.method == "GET":
        after, limit = _limit(request)
        return JSONResponse(pv.page([c.consent for c in gateway.voices.consents_of(owner)], after, limit))
    if len(gateway.voices.consents_of(owner)) >= gateway.voices.max_per_key:
        raise pv.VoiceInputError(f"this API key has {gateway.voices.max_per_key} consent recordings, the most "
                                 "it may keep; delete one first", None, "consent_limit_reached")  # fmt: skip
    form = await _form(request)
    name = pv.check_name(_text(form, "name"))
    language = pv.check_language(_text(form, "language"))
    data = await _file(form, "recording")
    await asyncio.to_thread(pv.decode_recording, data, "recording")  # an audio file, or a 400
    obj = pv.ConsentObject(id=gateway.voices.new_consent_id(), created_at=int(time.time()), language=language,
                           name=name)  # fmt: skip
    await gateway.voices.put_consent(StoredConsent(obj, owner), data)
    return _json(obj)


@_refusals
async def consent_endpoint(request: Request) -> Response:
    owner = _owner(request)
    gateway: Gateway = request.app.state.gateway
    consent_id = request.path_params["consent_id"]
    stored = gateway.voices.consent(owner, consent_id)
    if stored is None:
        return openai_error(404, f"No consent recording with id '{consent_id}'", param="consent_id",
                            code="not_found")  # fmt: skip
    if request.method == "GET":
        return _json(stored.consent)
    if request.method == "DELETE":
        await gateway.voices.drop_consent(consent_id)
        return _json(pv.ConsentDeleted(id=consent_id))
    form = await _form(request)  # POST: a new name
    name = pv.check_name(_text(form, "name"))
    if gateway.voices.consent(owner, consent_id) is not stored:  # deleted while the form was read: not back
        return openai_error(404, f"No consent recording with id '{consent_id}'", param="consent_id",
                            code="not_found")  # fmt: skip
    stored.consent.name = name
    await gateway.voices.put_consent(stored)
    return _json(stored.consent)
