"""Streaming Kyutai speech-to-text (the architecture of transformers'
``KyutaiSpeechToTextForConditionalGeneration``) on fixed slots, one 80 ms frame per step for every stream.

- ``config``: named shapes (``tiny`` for CPU tests, ``1b`` = kyutai/stt-1b-en_fr) and stream timing.
- ``checkpoint``: a ``save_pretrained`` directory (strict names) or random init; the text decoder.
- ``encoder``: the Mimi encoder streamed per slot (causal-conv contexts, ring-KV transformer, quantizer).
- ``decoder``: the text LM stepped once per frame per slot (ring KV over its sliding window), greedy.
- ``engine``: both on the shared slot engine (``streaming/slot_engine.py``): buckets, CUDA graphs per bucket; slot
  swaps (``exchange``) for the backend's catch-up of ending streams.
"""
