"""Qwen3-TTS-12Hz as published, streaming (used by ``realtime_gw.models.speech.tts_qwen3``).

- ``checkpoint``: the published directory layout (config.json ``qwen3_tts``, safetensors, text tokenizer,
  ``speech_tokenizer/``), weight holders under the published names, 0.6B/1.7B shapes for random init.
- ``talker``: talker + 5-layer code predictor, batched per frame, sampling as the reference's ``generate``.
- ``decoder``: the 12 Hz codec decoder, one frame per step per slot (causal-conv contexts, 72-frame ring KV).
- ``engine``: prompts and prefill on the shared slot engine (``streaming/slot_engine.py``).
- ``speaker``: the Base checkpoint's ECAPA-TDNN speaker encoder (log-mels -> x-vector).
- ``encoder``: the 12 Hz tokenizer's encoder (a recording -> codes, for ICL clones).
- ``voices``: registered voices (``--tts-voice-design``, ``--tts-voice-clone``) and ICL prompts.
"""
