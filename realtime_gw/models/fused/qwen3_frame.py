"""A Qwen3-TTS frame's decoder layers on the fused kernels (``ops``): the talker's stack (every stream at
its own position) and the code predictor's 15 passes, sampling included.

Talker, per layer: norm+QKV, q/k norms+rotary+K/V into each row's own column, attention causal from
each row's position (keys split over programs, then merged, on a long context), o-proj+residual,
norm+gate|up+SwiGLU, down+residual. Code predictor, per pass (one codebook) and layer: the same six
over the pass's positions; then final norm+head, the draws (torch's generator, as the eager sampler's,
so the codes match draw for draw), sampling, and the next input's embedding gathered into
``small_to_mtp_projection``: ~34 kernels a pass (the eager passes: ~2,000 kernels a frame), all
captured in the frame's CUDA graph. The frame's codec-embedding sum is the eager path's own (same
tensors, same reduction), so the talker's next input is the same too.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from realtime_gw.models.fused import ops
from realtime_gw.models.fused.attention import attention


class FusedQwen3Frame:
    """``Qwen3TalkerRuntime.talker_hidden``'s layers and ``predict_codes`` on the fused kernels, over the
    runtime's own caches and weights."""

    def __init__(self, rt: Any) -> None:
        self.rt = rt
        cp = rt.t.code_predictor
        self.cp = cp
        self.layers = rt.p_layers
        proj = cp.small_to_mtp_projection
        self.proj: tuple[torch.Tensor, torch.Tensor | None] | None = (
            (proj.weight.detach(), proj.bias.detach() if proj.bias is not None else None)
            if isinstance(proj, torch.nn.Linear)
            else None
        )
        self.heads = [h.weight.detach() for h in cp.lm_head]
        self.tables = [e.weight.detach() for e in cp.model.codec_embedding]
        self.norm = cp.model.norm.weight.detach()
        self.norm_eps = float(cp.model.norm.variance_epsilon)
        dev = self.norm.device
        self.vocab = self.heads[0].shape[0]
        self._draws = torch.empty(rt.slots, self.vocab, device=dev, dtype=torch.float32)
        self._logits = torch.empty(rt.slots, self.vocab, device=dev, dtype=self.heads[0].dtype)
        self.paths: dict[tuple[str, int], bool] = {}
        """(part, batch bucket) -> whether it runs fused (``choose``); a bucket not measured runs fused."""

    def on(self, part: str, b: int) -> bool:
        """Whether ``part`` (``talker`` or ``predictor``) runs fused at batch bucket ``b``."""
        return self.paths.get((part, b), True)

    @torch.no_grad()
    def choose(self, batches: list[int], length: int, timer: Any = None) -> dict[int, dict[str, Any]]:
        """Per batch bucket, the talker's layers and the code predictor each on the faster path, fused or
        eager: both timed as CUDA graph replays (the talker's over ``length`` cache columns), at warm-up and
        before the frame's graphs are captured. The fused kernels' tiles are tuned in the first run of each
        shape, so every shape a frame graph holds is tuned before its capture. Returns the timings.
        ``timer``: how a path is timed (``tuning.fastest``'s; default a CUDA graph replay)."""
        from realtime_gw.models.fused.tuning import fastest

        rt = self.rt
        report: dict[int, dict[str, Any]] = {}
        for b in batches:
            x = torch.zeros(b, rt.hidden, device=self.norm.device, dtype=rt.bos_emb.dtype)
            idle = torch.zeros(b, dtype=torch.bool, device=x.device)  # K/V to the scratch column
            code0 = torch.zeros(b, dtype=torch.long, device=x.device)
            bodies = {
                "talker": lambda b=b, x=x, idle=idle: rt.talker_hidden(b, length, x, idle),
                "predictor": lambda x=x, code0=code0: rt.predict_codes(x, code0),
            }
            report[b] = {}
            for part, body in bodies.items():
                paths = {
                    name: (lambda fused=fused, part=part, body=body, b=b: self._run_as(part, b, fused, body))
                    for name, fused in (("eager", False), ("fused", True))
                }
                name, ms = fastest(f"tts-qwen3 {part} at batch {b}", paths, timer)
                self.paths[(part, b)] = name == "fused"
                report[b][part] = {"chosen": name, "ms": ms}
        return report

    def _run_as(self, part: str, b: int, fused: bool, body: Any) -> None:
        self.paths[(part, b)] = fused
        body()

    def _project(
        self, rows: torch.Tensor | None, table: torch.Tensor, index: torch.Tensor | None
    ) -> torch.Tensor:
        """``small_to_mtp_projection`` of ``rows`` or of ``table``'s rows at ``index`` (one kernel)."""
        if self.proj is None:
            return rows if rows is not None else F.embedding(index, table)
        w, b = self.proj
        if rows is not None:
            return ops.linear(rows, w, b)
        return ops.linear(table, w, b, gather=index)

    @torch.no_grad()
    def talker_layers(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cols: torch.Tensor,
                      pos: torch.Tensor, length: int) -> torch.Tensor:  # fmt: skip
        """The talker's layers over ``x (b, hidden)``: row r at position ``pos[r]`` (rotary ``cos``/``sin``
        ``(b, D)``), its K/V written at cache column ``cols[r]``, attending to columns ``<= pos[r]`` of
        ``[0, length)``."""
        rt = self.rt
        b = x.shape[0]
        for j, lay in enumerate(rt.layers):
            kc, vc = rt.k_cache[j][:b], rt.v_cache[j][:b]
            qkv = ops.linear(x, lay.w_qkv, lay.b_qkv, norm=lay.ln1, eps=lay.eps)
            q = ops.rope_write(
                qkv, 1, lay.heads, lay.kv_heads, lay.head_dim, cos[:, None], sin[:, None], kc, vc, 0,
                lay.qk_norm, lay.qk_eps, cols=cols,
            )  # fmt: skip
            o = attention(q, 1, lay.heads, kc, vc, length, lay.scale, causal_from=pos)
            x = ops.linear(o, lay.w_o, lay.b_o, residual=x)
            gu = ops.linear(x, lay.w_gate_up, lay.b_gate_up, norm=lay.ln2, eps=lay.eps, glu=ops.ACT_SILU)
            x = ops.linear(gu, lay.w_down, lay.b_down, residual=x)
        return x

    def _layers(self, x: torch.Tensor, b: int, seq: int, start: int) -> torch.Tensor:
        rt = self.rt
        cos, sin = rt.p_cos[start : start + seq], rt.p_sin[start : start + seq]
        for j, lay in enumerate(self.layers):
            kc, vc = rt.pk_cache[j][:b], rt.pv_cache[j][:b]
            qkv = ops.linear(x, lay.w_qkv, lay.b_qkv, norm=lay.ln1, eps=lay.eps)
            q = ops.rope_write(
                qkv,
                seq,
                lay.heads,
                lay.kv_heads,
                lay.head_dim,
                cos,
                sin,
                kc,
                vc,
                start,
                lay.qk_norm,
                lay.qk_eps,
            )
            o = attention(q, seq, lay.heads, kc, vc, start + seq, lay.scale, causal_from=start)
            x = ops.linear(o, lay.w_o, lay.b_o, residual=x)
            gu = ops.linear(x, lay.w_gate_up, lay.b_gate_up, norm=lay.ln2, eps=lay.eps, glu=ops.ACT_SILU)
            x = ops.linear(gu, lay.w_down, lay.b_down, residual=x)
        return x

    @torch.no_grad()
    def __call__(self, h: torch.Tensor, code0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Codes ``(b, K)`` and the sum of the frame's K codec embeddings, as ``predict_codes``."""
        rt, sp = self.rt, self.rt.sampling
        b = h.shape[0]
        k = rt.num_codebooks
        e0 = rt.t.model.codec_embedding(code0)
        codes = torch.empty(b, k, dtype=torch.long, device=h.device)
        codes[:, 0] = code0
        x = self._project(torch.stack([h, e0], dim=1).view(2 * b, -1), self.tables[0], None)
        start, seq = 0, 2
        draws, logits = self._draws[:b], self._logits[:b]
        for i in range(k - 1):
            x = self._layers(x, b, seq, start)
            last = x.view(b, seq, -1)[:, -1]
            ops.linear(last, self.heads[i], norm=self.norm, eps=self.norm_eps, out=logits)
            if sp.sub_do_sample:
                draws.exponential_(1)  # the eager sampler's draw, same shape, same generator
            ops.sample(logits, codes[:, i + 1], sp.sub_do_sample, sp.sub_temperature, sp.sub_top_k, draws)
            if i < k - 2:
                x = self._project(None, self.tables[i], codes[:, i + 1])
            start, seq = start + seq, 1
        embs = [e0, *(F.embedding(codes[:, i + 1], self.tables[i]) for i in range(k - 1))]
        return codes, torch.stack(embs).sum(dim=0)
