"""The full-duplex speech-to-speech stage: Moshi (Kyutai) and PersonaPlex (NVIDIA) on fixed slots, one
80 ms frame per step for every live conversation (records: ``records/s2s.py``).

- ``config``: named shapes (``tiny`` for CPU tests, ``7b`` = moshiko/moshika or personaplex-7b-v1).
- ``weights``: the LM's tensors under Kyutai's published names; strict load, seeded random init.
- ``checkpoint``: a published directory (LM, Mimi, SentencePiece) or random init; text pieces.
- ``layers``: the temporal-transformer layer (on the shared ring-KV transformer) and the depformer.
- ``sampling``: temperature / top-k as published, the randomness a function of (seed, step, channel).
- ``lm``: ``LMGen.step`` batched over slots (the streams' delays, the silence switch).
- ``engine``: Mimi encoder + LM + Mimi decoder on the shared slot engine (buckets, CUDA graphs).
- ``backend``: the stage-worker ``Backend`` (``S2sOpen`` -> ``S2sFrame`` per ``S2sAudio``).
- ``prompt``: PersonaPlex's voice prompt and persona, prefilled in one pass when a conversation opens.
- ``voices``: PersonaPlex's voices (samples encoded once into codes; NVIDIA's published ``.pt``).
- ``personaplex``: the PersonaPlex backend (Moshi's, with the prompt and the voices).
"""
