"""The PersonaPlex architecture reference: NVIDIA's ``LMGen`` (github.com/NVIDIA/personaplex,
``moshi/moshi/models/lm.py`` at 3428dfd) ported line for line, greedy and batch 1, over Kyutai's own
``LMModel`` (``moshi==0.2.13``) at ``dep_q = 16``.

No ``personaplex`` package is published, and NVIDIA's fork pins an older torch and the streaming modules of
an older ``moshi``; its network (embeddings, the temporal transformer, the depformer with per-step weights,
the heads) is the package's ``LMModel`` with ``dep_q = 16`` (``loaders.get_moshi_lm``), so the package
builds it here. What the fork changed is its ``LMGen``: the cache of given (``provided``) tokens, the step
that writes the user's frame and runs the column before it, the 16-sub-step depformer fed the given codes,
and ``step_system_prompts`` (voice prompt, silence, text prompt, silence). That is what this module ports:
``prepare_step_input``, ``process_transformer_output``, ``depformer_step`` and the prompt sequence, with
their names, so a reader can hold the two side by side.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tests.models.s2s.moshi_reference import LMModel

ZERO_TEXT_CODE = 3
AUDIO_TOKENS_PER_STREAM = 8
SILENCE_FRAME_CNT = 6


class PersonaPlexGen:
    """``LMGen`` of NVIDIA/personaplex, greedy (``use_sampling=False``), one stream."""

    def __init__(self, lm: LMModel, silence: Sequence[int], sine: Sequence[int]) -> None:
        self.lm = lm
        self.max_delay = max(lm.delays)
        k = lm.num_codebooks
        self.cache = torch.full((1, k, self.max_delay + 3), lm.ungenerated_token_id, dtype=torch.long)
        self.provided = torch.zeros((1, k, self.max_delay + 3), dtype=torch.bool)
        initial = [lm.text_card] + [lm.card] * lm.n_q  # ``LMModel._get_initial_token`` of the fork
        self.initial = torch.tensor(initial).view(1, k, 1)
        self.offset = 0
        self.silence = torch.tensor(list(silence)).view(1, AUDIO_TOKENS_PER_STREAM, 1)
        self.sine = torch.tensor(list(sine)).view(1, AUDIO_TOKENS_PER_STREAM, 1)
        self.saved_embeddings: list[torch.Tensor] | None = None
        """While recording (``save_voice_prompt_embeddings``): each step's input embedding."""

    def __enter__(self) -> PersonaPlexGen:
        self._ctx = self.lm.streaming(1)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ctx.__exit__(*exc)

    def prepare_step_input(
        self, input_tokens: torch.Tensor | None, moshi_tokens: torch.Tensor | None, text_token: int | None
    ) -> tuple[torch.Tensor, ...] | None:
        lm, state_cache, provided = self.lm, self.cache, self.provided
        ct = state_cache.shape[2]
        if input_tokens is not None:
            for q_other in range(input_tokens.shape[1]):
                k = AUDIO_TOKENS_PER_STREAM + 1 + q_other
                write_position = (self.offset + lm.delays[k]) % ct
                state_cache[:, k, write_position] = input_tokens[:, q_other, 0]
                provided[:, k, write_position] = True
        if moshi_tokens is not None:
            for q_moshi in range(moshi_tokens.shape[1]):
                k = 1 + q_moshi
                write_position = (self.offset + lm.delays[k]) % ct
                state_cache[:, k, write_position] = moshi_tokens[:, q_moshi, 0]
                provided[:, k, write_position] = True
        if text_token is not None:
            write_position = (self.offset + lm.delays[0]) % ct
            state_cache[:, 0, write_position] = text_token
            provided[:, 0, write_position] = True
        for k, delay in enumerate(lm.delays):
            if self.offset <= delay:
                state_cache[:, k, self.offset % ct] = self.initial[:, k, 0]
                provided[:, k, self.offset % ct] = True
        if self.offset == 0:
            state_cache[:, :, 0] = self.initial[:, :, 0]
            self.offset += 1
            return None
        model_input_position = (self.offset - 1) % ct
        target_position = self.offset % ct
        input_ = state_cache[:, :, model_input_position : model_input_position + 1]
        target_ = state_cache[:, :, target_position : target_position + 1]
        provided_ = provided[:, :, target_position : target_position + 1]
        return input_, provided_, target_, model_input_position, target_position

    def step(
        self, input_tokens: torch.Tensor | None = None, moshi_tokens: torch.Tensor | None = None,
        text_token: int | None = None,
    ) -> torch.Tensor | None:  # fmt: skip
        prepared = self.prepare_step_input(input_tokens, moshi_tokens, text_token)
        if prepared is None:
            return None
        input_, provided_, target_, model_input_position, target_position = prepared
        if self.saved_embeddings is not None:
            self.saved_embeddings.append(self.embed_codes(input_))
        transformer_out, text_logits = self.lm.forward_text(input_.clone())
        return self.process_transformer_output(
            transformer_out, text_logits, provided_, target_, model_input_position, target_position
        )

    def embed_codes(self, sequence: torch.Tensor) -> torch.Tensor:
        """``LMModel.embed_codes`` of the fork: every audio stream's embedding, then the text's."""
        lm = self.lm
        input_ = None
        for cb_index in range(lm.num_audio_codebooks):
            audio_emb = lm.emb[cb_index](sequence[:, cb_index + lm.audio_offset])
            input_ = audio_emb if input_ is None else input_ + audio_emb
        return input_ + lm.text_emb(sequence[:, 0])

    def process_transformer_output(
        self, transformer_out: torch.Tensor, text_logits: torch.Tensor, provided_: torch.Tensor,
        target_: torch.Tensor, model_input_position: int, target_position: int,
    ) -> torch.Tensor | None:  # fmt: skip
        lm = self.lm
        sampled_text_token = text_logits[0, 0, 0].float().argmax()[None]
        next_text_token = torch.where(provided_[:, 0, 0], target_[:, 0, 0], sampled_text_token)
        sampled_audio_tokens = self.depformer_step(
            next_text_token, transformer_out, target_[:, 1:, 0], provided_[:, 1:, 0]
        )
        self.provided[:, :, model_input_position] = False
        cache = self.cache
        cache[:, 0, target_position] = torch.where(
            ~self.provided[:, 0, target_position], sampled_text_token, cache[:, 0, target_position]
        )
        cache[:, 1 : lm.dep_q + 1, target_position] = torch.where(
            ~self.provided[:, 1 : lm.dep_q + 1, target_position],
            sampled_audio_tokens,
            cache[:, 1 : lm.dep_q + 1, target_position],
        )
        if self.offset <= self.max_delay:
            self.offset += 1
            return None
        ct = cache.shape[2]
        delays = torch.tensor(lm.delays[: lm.dep_q + 1])
        index = ((self.offset - self.max_delay + delays) % ct).view(1, -1, 1)
        out = cache.gather(dim=2, index=index)
        self.offset += 1
        return out

    def depformer_step(
        self, text_token: torch.Tensor, transformer_out: torch.Tensor, audio_tokens: torch.Tensor,
        audio_provided: torch.Tensor,
    ) -> torch.Tensor:  # fmt: skip
        lm = self.lm
        prev_token = text_token
        tokens = []
        with lm.depformer.streaming(1):
            for cb_index in range(lm.dep_q):
                logits = lm.forward_depformer(cb_index, prev_token[:, None, None], transformer_out)
                next_token = logits[0, 0, 0].float().argmax()[None]
                prev_token = torch.where(audio_provided[:, cb_index], audio_tokens[:, cb_index], next_token)
                tokens.append(next_token)
        return torch.stack(tokens, dim=1)

    def step_system_prompts(
        self, voice: torch.Tensor | None, text_prompt_tokens: Sequence[int], save_voice: bool = False
    ) -> dict[str, torch.Tensor] | None:
        """``_step_voice_prompt`` (from codes: ``voice (F, 8)``), ``_step_audio_silence``,
        ``_step_text_prompt``, ``_step_audio_silence``. ``save_voice``: what the fork saves as
        ``NAME.pt`` with ``save_voice_prompt_embeddings`` (the embeddings, the cache after the voice)."""
        self.saved_embeddings = [] if save_voice else None
        for f in range(0 if voice is None else voice.shape[0]):
            assert voice is not None
            self.step(input_tokens=self.sine, moshi_tokens=voice[f].view(1, -1, 1), text_token=ZERO_TEXT_CODE)
        saved = None
        if self.saved_embeddings is not None:
            saved = {"embeddings": torch.stack(self.saved_embeddings, dim=0).detach(), "cache": self.cache.clone()}
            self.saved_embeddings = None
        for _ in range(SILENCE_FRAME_CNT):
            self.step(input_tokens=self.sine, moshi_tokens=self.silence, text_token=ZERO_TEXT_CODE)
        for token in text_prompt_tokens:
            self.step(input_tokens=self.sine, moshi_tokens=self.silence, text_token=token)
        for _ in range(SILENCE_FRAME_CNT):
            self.step(input_tokens=self.sine, moshi_tokens=self.silence, text_token=ZERO_TEXT_CODE)
        return saved
