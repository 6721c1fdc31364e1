"""Codec-LM speech synthesis pieces used by ``realtime_gw.models.speech.tts_codec``.

- ``spec``: named model shapes (``tiny`` for CPU tests, ``full`` = Qwen3-TTS-0.6B-shaped) and the local
  weight-directory format.
- ``talker``: the Qwen3 talker + code predictor with static, slot-indexed KV caches.
- ``mimi_stream``: a Mimi decoder that decodes one codec frame per step for many streams at once.
- ``engine``: slots, one batched frame step (talker -> decoder), CUDA graphs per batch bucket.
- ``text``: the word-level text feed (tokenizers: ``realtime_gw.models.tokenizers``).
"""
