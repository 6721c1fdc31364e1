"""The streaming kit shared by the frame-stepped speech families (codec-LM TTS, Qwen3-TTS, Kyutai STT).

- ``layers``: per-slot causal-conv contexts, transposed-conv overlaps and a sliding-window transformer
  with ring K/V, for decoders and encoders that advance one frame per step for many streams at once.
- ``slot_engine``: fixed slots and the batched frame step (talker, then decoder), CUDA graphs per bucket.
- ``frame_engine``: the protocol the TTS frame loop drives (``FrameEngine``).
- ``text_feed``: the word-level text feed of the TTS talkers.

A family (``codec/``, ``qwen3/``, ``kyutai/``) keeps only its own layers and checkpoint format.
"""
