"""Qwen3-TTS talker + code predictor, one 80 ms frame per step for many slots, sampling as the reference.

Per frame and stream: the talker (a Qwen3 stack over ``text_projection(text_embedding(token))`` plus the
sum of the previous frame's 16 codec embeddings) gives a hidden state; ``codec_head`` predicts codebook 0;
the 5-layer code predictor, fed ``[hidden, embed(code0)]`` then one code at a time (through
``small_to_mtp_projection`` when its width differs), fills codebooks 1..15 — the frame's 16 codes.

A stream starts with a prompt (``prefill``): ``<|im_start|>assistant\\n`` as text, then the codec prefix
(think/nothink, think_bos, [language], think_eos, [speaker], pad) under ``tts_pad``.. ``tts_bos``; its last
position — first text token + codec BOS — is the first frame step's input, so the first frame leaves after
one prefill and one frame step. Then text leads the audio by one token per frame: frame k's input carries
text token k, then ``tts_eos`` once, then ``tts_pad`` (the reference's streaming mode).

Sampling follows transformers' ``generate`` as the reference calls it: codebook 0 gets the repetition
penalty over the stream's earlier codebook-0 ids, the suppressed id range ``[vocab - 1024, vocab)`` except
EOS, EOS masked while not allowed (``min_new_tokens=2``, and while text is still arriving); then
temperature, top-k, softmax and one exponential draw per row (``torch.multinomial``'s own method, so
with one stream on the CPU the draws equal the reference's under the same seed). Greedy = argmax.
All on device, no host sync: graph-capturable. K/V layout and the fused layers are
``codec/talker.py``'s (``FusedQwen3Layer``), attention and rotary ``models/kernels.py``'s.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from realtime_gw.models.kernels import (
    KeyMask,
    additive_mask,
    layers_at_positions,
    layers_over_span,
    rope_cos_sin,
)
from realtime_gw.models.speech.codec.talker import FusedQwen3Layer
from realtime_gw.models.speech.qwen3.checkpoint import Qwen3TtsCheckpoint

log = logging.getLogger(__name__)

VECTOR_POSITION = -2
"""A prompt position whose codec part is a given vector (a Base checkpoint's x-vector), not an embedding."""


@dataclass(frozen=True)
class Sampling:
    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    repetition_penalty: float = 1.05
    sub_do_sample: bool = True
    sub_temperature: float = 0.9
    sub_top_k: int = 50

    @classmethod
    def from_generation(cls, g: dict, **override: object) -> Sampling:
        kw = {
            "do_sample": g.get("do_sample", True),
            "temperature": g.get("temperature", 0.9),
            "top_k": g.get("top_k", 50),
            "repetition_penalty": g.get("repetition_penalty", 1.05),
            "sub_do_sample": g.get("subtalker_dosample", True),
            "sub_temperature": g.get("subtalker_temperature", 0.9),
            "sub_top_k": g.get("subtalker_top_k", 50),
        }
        kw.update(override)
        return cls(**kw)  # type: ignore[arg-type]


def sample(logits: torch.Tensor, do_sample: bool, temperature: float, top_k: int) -> torch.Tensor:
    """transformers' sampling tail on float32 logits ``(b, V)``: temperature, top-k, softmax, multinomial —
    the multinomial as ``argmax(probs / Exp(1))``, which is what ``torch.multinomial`` does for one sample."""
    if not do_sample:
        return logits.argmax(dim=-1)
    s = logits / temperature
    k = min(top_k, s.shape[-1])
    if k > 0:
        kth = torch.topk(s, k).values[:, -1:]
        s = s.masked_fill(s < kth, float("-inf"))
    probs = torch.softmax(s, dim=-1)
    q = torch.empty_like(probs).exponential_(1)
    return (probs / q).argmax(dim=-1)


def _inv_freq(theta: float, dim: int, device: torch.device) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim))


class Qwen3TalkerRuntime:
    """Static per-slot state (K/V, position, previous frame's embedding, codebook-0 history) and the
    batched steps: ``prefill`` (new streams' prompts) and ``frame_step`` (one frame for slots [0, B))."""

    def __init__(
        self,
        ck: Qwen3TtsCheckpoint,
        slots: int,
        max_positions: int,
        sampling: Sampling,
        compile_predictor: str | None = None,
        fused_predictor: bool = False,
    ) -> None:
        t = ck.talker
        c, pc = ck.talker_config, ck.talker_config["code_predictor_config"]
        p = next(t.parameters())
        dev, dt = p.device, p.dtype
        self.t = t
        self.slots = slots
        self.max_positions = max_positions
        self.sampling = sampling
        self.num_codebooks = c.get("num_code_groups", 16)
        self.hidden = c["hidden_size"]
        self.vocab = c["vocab_size"]
        self.eos_id = int(c["codec_eos_token_id"])
        self.bos_id = int(c["codec_bos_id"])
        self.layers = [FusedQwen3Layer.of(layer) for layer in t.model.layers]
        self.p_layers = [FusedQwen3Layer.of(layer) for layer in t.code_predictor.model.layers]
        l0, pl = self.layers[0], self.p_layers[0]
        self.k_cache = [
            torch.zeros(slots, l0.kv_heads, max_positions + 1, l0.head_dim, device=dev, dtype=dt)
            for _ in self.layers
        ]  # +1: scratch column for inactive rows
        self.v_cache = [torch.zeros_like(k) for k in self.k_cache]
        k = self.num_codebooks
        self.pk_cache = [
            torch.zeros(slots, pl.kv_heads, k, pl.head_dim, device=dev, dtype=dt) for _ in self.p_layers
        ]
        self.pv_cache = [torch.zeros_like(x) for x in self.pk_cache]
        self.pos = torch.zeros(slots, dtype=torch.long, device=dev)
        self.last_emb = torch.zeros(slots, self.hidden, device=dev, dtype=dt)
        self.seen = torch.zeros(slots, self.vocab, dtype=torch.bool, device=dev)
        self.inv_freq = _inv_freq(float(c.get("rope_theta", 10000)), l0.head_dim, dev)
        self.p_cos, self.p_sin = rope_cos_sin(
            torch.arange(k, device=dev),
            _inv_freq(float(pc.get("rope_theta", 10000)), pl.head_dim, dev),
            1.0,
            dt,
        )
        self.p_masks: list[torch.Tensor] = []
        start, s = 0, 2
        for _ in range(k - 1):
            q_pos = torch.arange(start, start + s, device=dev)
            m = torch.arange(start + s, device=dev)[None, :] <= q_pos[:, None]
            self.p_masks.append(additive_mask(m[None], 1, pl.heads // pl.kv_heads, dt))
            start, s = start + s, 1
        suppress = torch.zeros(self.vocab, device=dev)
        suppress[max(0, self.vocab - 1024) :] = float("-inf")  # the reference's suppress_tokens
        suppress[self.eos_id] = 0.0
        self.suppress = suppress
        self.positions = torch.arange(max_positions, device=dev)
        self.codes_out = torch.zeros(slots, k, dtype=torch.long, device=dev)
        with torch.no_grad():
            self.bos_emb = t.model.codec_embedding.weight[self.bos_id].detach().clone()
        self.fused_predictor: Any = None
        """The frame's layers (talker and code predictor) on the fused Triton kernels (``models.fused``) at
        the batch buckets where they are faster (``FusedQwen3Frame.choose``), or None: the eager layers."""
        if fused_predictor:
            from realtime_gw.models.fused.qwen3_frame import FusedQwen3Frame

            self.fused_predictor = FusedQwen3Frame(self)
        self.compiled_predictor = compile_predictor is not None and not fused_predictor
        if self.compiled_predictor and compile_predictor is not None:
            self._compile_predictor(compile_predictor, k, pl, dev, dt)

    def _compile_predictor(
        self, backend: str, k: int, pl: FusedQwen3Layer, dev: torch.device, dt: torch.dtype
    ) -> None:
        """The code predictor's passes through ``torch.compile`` (``--tts-compile``). Each pass attends over
        all ``k`` cache columns under a mask and gets its rotary rows, columns, head and embedding as
        arguments, so all passes after the first have one shape: two compiled functions (first pass, later
        passes), each compiled for batch 1 and then once for any batch. ``backend``: torch.compile's
        (``inductor``; the CPU tests trace with ``aot_eager``); inductor's ``fallback_random`` keeps the
        sampling draws on torch's generator, as eager's. It fuses the elementwise work but leaves the ~300
        small GEMMs of a frame as they are, so it gains little (docs/benchmarks.md)."""
        opts = {"fallback_random": True} if backend == "inductor" else None
        self._first_pass = torch.compile(self._pass_first, fullgraph=True, backend=backend, options=opts)
        self._next_pass = torch.compile(self._pass_next, fullgraph=True, backend=backend, options=opts)
        self.p_pass: list[tuple[torch.Tensor, ...]] = []
        start, s = 0, 2
        for _ in range(k - 1):
            q_pos = torch.arange(start, start + s, device=dev)
            seen = torch.arange(k, device=dev)[None, :] <= q_pos[:, None]
            mask = additive_mask(seen[None], 1, pl.heads // pl.kv_heads, dt)
            cos = self.p_cos[None, start : start + s, None].contiguous()
            sin = self.p_sin[None, start : start + s, None].contiguous()
            self.p_pass.append((cos, sin, q_pos, mask))
            start, s = start + s, 1

    # -- embeddings --------------------------------------------------------------------------------------------
    def text_embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.t.text_projection(self.t.model.text_embedding(ids))

    # -- slots -------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def prefill(
        self,
        slots: torch.Tensor,
        text_ids: torch.Tensor,
        codec_ids: torch.Tensor,
        lengths: torch.Tensor,
        vectors: torch.Tensor | None = None,
    ) -> None:
        """Prompts ``(n, P)`` of new streams into ``slots``: position i's input is ``text_embed(text_ids)``
        plus ``codec_embedding(codec_ids)`` where ``codec_ids >= 0``, or ``vectors[r, i]`` (``(n, P, H)``)
        where ``codec_ids == VECTOR_POSITION`` (nothing where it is -1: text only). Writes K/V for positions ``[0, P)``
        (those past a row's length are never read: masked until overwritten), sets position = length, the
        next input's codec part to BOS, and clears the codebook-0 history."""
        n, plen = text_ids.shape
        emb = self.t.model.codec_embedding(codec_ids.clamp(min=0))
        codec = torch.where((codec_ids >= 0)[..., None], emb, torch.zeros_like(emb))
        if vectors is not None:
            at = (codec_ids == VECTOR_POSITION)[..., None]
            codec = torch.where(at, vectors.to(codec.dtype), codec)
        x = self.text_embed(text_ids) + codec
        pos = torch.arange(plen, device=x.device)
        cos, sin = rope_cos_sin(pos, self.inv_freq, 1.0, x.dtype)
        cos, sin = cos[None, :, None], sin[None, :, None]
        l0 = self.layers[0]
        causal = (pos[None, :] <= pos[:, None])[None]
        mask_add = additive_mask(causal, 1, l0.heads // l0.kv_heads, x.dtype)
        h = x
        for i, layer in enumerate(self.layers):
            scratch: list[torch.Tensor] = []
            kc, vc = self.k_cache[i], self.v_cache[i]

            def write(
                k: torch.Tensor,
                v: torch.Tensor,
                kc: torch.Tensor = kc,
                vc: torch.Tensor = vc,
                scratch: list[torch.Tensor] = scratch,
            ) -> None:
                kc[:, :, :plen].index_copy_(0, slots, k)
                vc[:, :, :plen].index_copy_(0, slots, v)
                scratch += [k, v]

            h = layer(h, cos, sin, write, _Lazy(scratch, 0), _Lazy(scratch, 1), mask_add)
        self._begin(slots, lengths)

    def _begin(self, slots: torch.Tensor, lengths: torch.Tensor, first: torch.Tensor | None = None) -> None:
        """After a prompt's K/V are in ``slots``: position = length, next codec input ``first`` (``(H,)``;
        default BOS), no history."""
        n = slots.shape[0]
        self.pos.index_copy_(0, slots, lengths)
        start = self.bos_emb if first is None else first.to(self.bos_emb.dtype)
        self.last_emb.index_copy_(0, slots, start.expand(n, -1).contiguous())
        self.seen.index_fill_(0, slots, False)

    @torch.no_grad()
    def export_prompt(self, slot: int, length: int) -> torch.Tensor:
        """The K/V of the prompt prefilled in ``slot``, ``(layers, 2, kv_heads, length, head_dim)``: a
        prompt's K/V depend on the prompt alone, so streams opened with the same prompt copy them
        (``load_prompt``) instead of running the prefill again."""
        return torch.stack(
            [c[i][slot, :, :length] for i in range(len(self.layers)) for c in (self.k_cache, self.v_cache)]
        ).unflatten(0, (len(self.layers), 2))

    @torch.no_grad()
    def load_prompt(self, slots: torch.Tensor, kv: torch.Tensor, first: torch.Tensor | None = None) -> None:
        """Start ``slots`` from a prompt's K/V (``export_prompt``): as ``prefill`` of that prompt would."""
        n, length = slots.shape[0], kv.shape[3]
        for i in range(len(self.layers)):
            self.k_cache[i][:, :, :length].index_copy_(0, slots, kv[i, 0].expand(n, -1, -1, -1))
            self.v_cache[i][:, :, :length].index_copy_(0, slots, kv[i, 1].expand(n, -1, -1, -1))
        self._begin(slots, torch.full((n,), length, dtype=torch.long, device=slots.device), first)

    # -- the frame -----------------------------------------------------------------------------------------------
    def talker_hidden(self, b: int, length: int, x: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        pos = self.pos[:b]
        cos, sin = rope_cos_sin(pos, self.inv_freq, 1.0, x.dtype)
        col = torch.where(active, pos, self.max_positions)
        if self.fused_predictor is not None and self.fused_predictor.on("talker", b):
            h = self.fused_predictor.talker_layers(x, cos, sin, col, pos, length)
        else:
            l0 = self.layers[0]
            mask = (self.positions[None, :length] <= pos[:, None])[:, None, :]
            mask_add = additive_mask(mask, l0.kv_heads, l0.heads // l0.kv_heads, x.dtype)
            visible = KeyMask(mask_add, (pos + 1).to(torch.int32))  # the decode kernel reads no further
            cos, sin = cos[:, None, None, :], sin[:, None, None, :]
            h = layers_at_positions(
                self.layers, x[:, None, :], cos, sin, self.k_cache, self.v_cache, col, length, visible
            )[:, 0]
        norm = self.t.model.norm
        return F.rms_norm(h, (self.hidden,), norm.weight, norm.variance_epsilon)

    def predict_codes(self, h: torch.Tensor, code0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Codebooks 1..K-1 for a frame; returns codes ``(b, K)`` and the sum of the frame's 16 embeddings."""
        if self.fused_predictor is not None and self.fused_predictor.on("predictor", h.shape[0]):
            return self.fused_predictor(h, code0)
        cp, sp = self.t.code_predictor, self.sampling
        e0 = self.t.model.codec_embedding(code0)
        embs, codes = [e0], [code0]
        x = cp.small_to_mtp_projection(torch.stack([h, e0], dim=1))
        if self.compiled_predictor:
            try:
                for i in range(self.num_codebooks - 1):
                    run = self._first_pass if i == 0 else self._next_pass
                    head, emb = cp.lm_head[i].weight, cp.model.codec_embedding[i].weight
                    code, e, x = run(x, *self.p_pass[i], head, emb)
                    codes.append(code)
                    embs.append(e)
                return torch.stack(codes, dim=1), torch.stack(embs).sum(dim=0)
            except Exception:  # a compile that fails (first calls, at warm-up) leaves the eager passes
                log.exception("compiling the code predictor failed; it runs uncompiled")
                self.compiled_predictor = False
                embs, codes = [e0], [code0]
                x = cp.small_to_mtp_projection(torch.stack([h, e0], dim=1))
        start = 0
        for i in range(self.num_codebooks - 1):
            end = start + x.shape[1]
            cos, sin = self.p_cos[None, start:end, None], self.p_sin[None, start:end, None]
            x = layers_over_span(
                self.p_layers, x, cos, sin, self.pk_cache, self.pv_cache, start, end, self.p_masks[i]
            )
            pn = cp.model.norm
            hp = F.rms_norm(x[:, -1], (x.shape[-1],), pn.weight, pn.variance_epsilon)
            code = sample(cp.lm_head[i](hp).float(), sp.sub_do_sample, sp.sub_temperature, sp.sub_top_k)
            e = cp.model.codec_embedding[i](code)
            codes.append(code)
            embs.append(e)
            x = cp.small_to_mtp_projection(e[:, None, :])
            start = end
        return torch.stack(codes, dim=1), torch.stack(embs).sum(dim=0)

    def _pass_first(self, *args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self._predictor_pass(*args)

    def _pass_next(self, *args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self._predictor_pass(*args)  # its own code object: its own compile cache

    def _predictor_pass(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cols: torch.Tensor,
        mask: torch.Tensor,
        head: torch.Tensor,
        emb: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One code-predictor pass (the compiled form): K/V of ``x``'s positions into cache columns ``cols``,
        attention over every column under ``mask``; returns the code, its embedding and the next input."""
        b = x.shape[0]
        for j, layer in enumerate(self.p_layers):
            kc, vc = self.pk_cache[j][:b], self.pv_cache[j][:b]

            def write(k: torch.Tensor, v: torch.Tensor, kc: torch.Tensor = kc, vc: torch.Tensor = vc) -> None:
                kc.index_copy_(2, cols, k)
                vc.index_copy_(2, cols, v)

            x = layer(x, cos, sin, write, kc, vc, mask)
        cp, sp = self.t.code_predictor, self.sampling
        pn = cp.model.norm
        hp = F.rms_norm(x[:, -1], (x.shape[-1],), pn.weight, pn.variance_epsilon)
        code = sample(F.linear(hp, head).float(), sp.sub_do_sample, sp.sub_temperature, sp.sub_top_k)
        e = F.embedding(code, emb)
        return code, e, cp.small_to_mtp_projection(e[:, None, :])

    def frame_step(
        self, b: int, length: int, text_tokens: torch.Tensor, active: torch.Tensor, eos_ok: torch.Tensor
    ) -> torch.Tensor:
        """Advance every active slot in ``[0, b)`` by one frame; returns codes ``(b, K)``."""
        sp = self.sampling
        x = self.text_embed(text_tokens) + self.last_emb[:b]
        h = self.talker_hidden(b, length, x, active)
        logits = self.t.codec_head(h).float()
        if sp.repetition_penalty != 1.0:
            r = sp.repetition_penalty
            logits = torch.where(self.seen[:b], torch.where(logits < 0, logits * r, logits / r), logits)
        logits = logits + self.suppress
        logits[:, self.eos_id] = logits[:, self.eos_id].masked_fill(~eos_ok, float("-inf"))
        code0 = sample(logits, sp.do_sample, sp.temperature, sp.top_k)
        codes, emb_sum = self.predict_codes(h, code0)
        seen = self.seen[:b]
        hit = torch.zeros_like(seen).scatter_(1, code0[:, None], True)  # not one_hot: it syncs on CUDA
        seen.copy_(seen | (hit & active[:, None]))
        self.last_emb[:b] = torch.where(active[:, None], emb_sum, self.last_emb[:b])
        self.pos[:b].add_(active.long())
        self.codes_out[:b] = codes
        return codes


class _Lazy:
    """Prefill attends over the K/V it just computed, which exist only once ``write`` ran: a stand-in
    that ``attend`` reads as a tensor (shape and views resolve at use)."""

    def __init__(self, box: list[torch.Tensor], i: int) -> None:
        self.box, self.i = box, i

    def __getattr__(self, name: str) -> object:
        return getattr(self.box[self.i], name)

    def __getitem__(self, key: object) -> torch.Tensor:
        return self.box[self.i][key]
