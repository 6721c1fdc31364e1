"""The Mimi codec-LM TTS family (``realtime_gw.models.speech.tts_codec``); the streaming kit it shares with
Qwen3-TTS and Kyutai STT is ``realtime_gw.models.speech.streaming``.

- ``spec``: named model shapes (``tiny`` for CPU tests, ``full`` = Qwen3-TTS-0.6B-shaped) and the local
  weight-directory format.
- ``talker``: the Qwen3 talker + code predictor with static, slot-indexed KV caches.
- ``mimi_stream``: a Mimi decoder that decodes one codec frame per step for many streams at once.
- ``engine``: the family's ``SlotEngine`` (``streaming/slot_engine.py``): talker -> Mimi decoder per step.
"""
