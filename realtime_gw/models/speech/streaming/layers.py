"""Streaming building blocks shared by the codec decoders (Mimi, Qwen3-TTS 12 Hz): per-slot causal-conv
contexts, transposed-conv overlaps, and a sliding-window transformer with ring K/V.

Every function works on slots ``[0, B)`` with an ``active`` mask: inactive rows keep their state
(``torch.where``) and write ring K/V into a scratch column, so shapes are static for CUDA graphs.
Decoding frames one at a time this way equals the models' full-utterance forward (causal convs,
right-trimmed transposed convs, a causal sliding-window mask), which each decoder's tests check.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from realtime_gw.models.fp8 import FP8
from realtime_gw.models.kernels import (
    KeyMask,
    additive_mask,
    fuse_linears,
    layers_at_positions,
    qkv_heads,
    rope_attend,
    rope_cos_sin,
)


class _Tf32Users:
    """The process-wide TF32 / cuDNN-benchmark flags, shared by every thread inside ``fp32_mode``.

    cuBLAS's and cuDNN's TF32 switches (``allow_tf32``, and the ``fp32_precision`` settings of torch >= 2.9
    alike) live in ATen's global context: there is no per-thread or per-call switch. Stage
    threads (VAD, codec decoders, ASR encoder) enter ``fp32_mode`` concurrently, so a plain save/restore
    per user could restore a state saved while another user had the flags flipped, and leave TF32 on
    (or off) for good. Instead the users are counted under a lock:

    - the flags are saved when the first user enters and restored when the last one leaves;
    - while any user wants strict float32, TF32 is off for everyone; with only TF32 users it is on;
    - ``cudnn.benchmark`` is on while any user asks for it (or it was on before).

    Strict wins because it is a correctness requirement (parity with the float32 reference) and TF32 is
    only a permission to go faster: a TF32 user that overlaps a strict one gets full float32 (slower,
    never less precise). Blocking one mode until the other's users leave would instead tie one stage's
    latency to another's and deadlock on a thread nesting both modes. Nesting in one thread is counted
    like any other user. The flags are read when kernels are launched or captured into a CUDA graph: a
    TF32 graph captured while a strict user is inside keeps its float32 kernels (slower, as precise).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._strict = 0
        self._tf32 = 0
        self._benchmark = 0
        self._saved: tuple[bool, bool, bool] | None = None

    @contextlib.contextmanager
    def use(self, tf32: bool, cudnn_benchmark: bool) -> Iterator[None]:
        cudnn = torch.backends.cudnn
        with self._lock:
            if self._saved is None:
                self._saved = (cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32, cudnn.benchmark)
            if tf32:
                self._tf32 += 1
            else:
                self._strict += 1
            self._benchmark += cudnn_benchmark
            self._apply()
        try:
            yield
        finally:
            with self._lock:
                if tf32:
                    self._tf32 -= 1
                else:
                    self._strict -= 1
                self._benchmark -= cudnn_benchmark
                self._apply()

    def _apply(self) -> None:
        """Set the flags for the users inside now (the saved ones when none is): under the lock."""
        assert self._saved is not None
        cudnn = torch.backends.cudnn
        if self._strict + self._tf32 == 0:
            cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32, cudnn.benchmark = self._saved
            self._saved = None
            return
        cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = self._strict == 0
        cudnn.benchmark = self._saved[2] or self._benchmark > 0


_TF32_USERS = _Tf32Users()


def tf32_flags(tf32: bool, cudnn_benchmark: bool = False) -> contextlib.AbstractContextManager[None]:
    """The process-wide TF32 flags as ``fp32_mode`` sets them, on any device (``_Tf32Users``: strict wins)."""
    return _TF32_USERS.use(tf32, cudnn_benchmark)


@contextlib.contextmanager
def fp32_mode(device: torch.device, tf32: bool, cudnn_benchmark: bool = False) -> Iterator[None]:
    """TF32 in cuDNN convs and cuBLAS matmuls on or off while a decoder runs (or is captured into a
    graph), whatever the process-wide setting; restored after the last concurrent user leaves, and off
    while any thread wants strict float32 (``_Tf32Users``). ``cudnn_benchmark``: cuDNN times its
    algorithms for each new conv shape (at a graph's warm-up run, before capture) and keeps the fastest."""
    if device.type != "cuda":
        yield
        return
    with tf32_flags(tf32, cudnn_benchmark):
        yield


def strict_fp32(device: torch.device) -> contextlib.AbstractContextManager[None]:
    """No TF32 while a decoder runs: the decoders are meant to be float32, and TF32 would move samples
    by ~1e-3."""
    return fp32_mode(device, False)


class SlotStates:
    """Per-slot state tensors ``(slots, channels, length)`` (float32 unless asked), zeroed together on reset."""

    def __init__(self, slots: int, device: torch.device) -> None:
        self.slots = slots
        self.device = device
        self.tensors: list[torch.Tensor] = []

    def new(self, channels: int, length: int, dtype: torch.dtype = torch.float32) -> int:
        self.tensors.append(torch.zeros(self.slots, channels, length, device=self.device, dtype=dtype))
        return len(self.tensors) - 1

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.tensors[i]

    @torch.no_grad()
    def reset(self, slots: torch.Tensor) -> None:
        for st in self.tensors:
            st.index_fill_(0, slots, 0.0)


def causal_conv_step(
    conv: nn.Conv1d,
    x: torch.Tensor,
    state: torch.Tensor | None,
    act: torch.Tensor,
    fresh: torch.Tensor | None = None,
) -> torch.Tensor:
    """A stride-1 causal conv over this frame's samples ``x (b, C, n)``; ``state`` holds the last
    ``(k-1)*dilation`` inputs (zeros at start = the left zero padding). With ``fresh`` the context of a
    fresh row is the first sample repeated (replicate padding)."""
    if state is None:
        return conv(x)
    ctx = torch.where(fresh, x[..., :1].expand_as(state), state) if fresh is not None else state
    full = torch.cat([ctx, x], dim=-1)
    state.copy_(torch.where(act, full[..., -state.shape[-1] :], state))
    return conv(full)


def transposed_conv_step(
    conv: nn.ConvTranspose1d, x: torch.Tensor, overlap: torch.Tensor | None, act: torch.Tensor
) -> torch.Tensor:
    """A transposed conv whose ``k - stride`` right samples are trimmed in the full forward: add the
    previous frames' overlap, emit ``n * stride`` samples, keep the new tail in ``overlap``."""
    s = conv.stride[0]
    n = x.shape[-1]
    y = F.conv_transpose1d(x, conv.weight, None, s, 0, 0, conv.groups)
    if overlap is not None:
        keep = overlap.shape[-1]
        y = torch.cat([y[..., :keep] + overlap, y[..., keep:]], dim=-1)
        overlap.copy_(torch.where(act, y[..., n * s :], overlap))
    out = y[..., : n * s]
    if conv.bias is not None:
        out = out + conv.bias[None, :, None]
    return out


@dataclass
class ConvOp:
    """One step of a compiled conv stack: a causal conv (``"conv"``), a residual block (``"res"``: ``sub``
    then ``shortcut``), a stateless module (``"fn"``) or a kind a program adds (the decoder's ``"convt"``)."""

    kind: str
    module: Any
    state: int = -1  # index into the program's slot states; -1 = no context
    replicate: bool = False
    sub: list[ConvOp] | None = None
    shortcut: ConvOp | None = None


class ConvProgram:
    """A Mimi-style conv stack (causal convs, residual blocks, plain modules) compiled into ``ConvOp`` s with
    per-slot state, next to a ``RingTransformer``. Subclasses set the attributes, say how long a conv's left
    context is (``conv_context``, raising for convs they cannot stream), and may add op kinds by extending
    ``compile`` and ``run``."""

    states: SlotStates
    ring: RingTransformer
    conv_type: type[nn.Module]
    residual_type: type[nn.Module]

    def conv_context(self, layer: Any) -> int:
        raise NotImplementedError

    def compile(self, layer: nn.Module) -> ConvOp:
        if isinstance(layer, self.conv_type):
            ctx = self.conv_context(layer)
            pad_mode = layer.pad_mode
            if pad_mode not in ("constant", "replicate"):
                raise NotImplementedError(f"pad_mode {pad_mode!r} cannot stream")
            state = self.states.new(layer.conv.in_channels, ctx) if ctx > 0 else -1
            return ConvOp("conv", layer, state, replicate=pad_mode == "replicate")
        if isinstance(layer, self.residual_type):
            sub = [self.compile(m) for m in layer.block]
            short = self.compile(layer.shortcut) if isinstance(layer.shortcut, self.conv_type) else None
            return ConvOp("res", layer, sub=sub, shortcut=short)
        return ConvOp("fn", layer)

    @torch.no_grad()
    def reset(self, slots: torch.Tensor) -> None:
        """Fresh streams in ``slots`` (a device index tensor): one kernel per state tensor, any count."""
        self.states.reset(slots)
        self.ring.reset(slots)

    def state_of(self, op: ConvOp, b: int) -> torch.Tensor | None:
        return self.states[op.state][:b] if op.state >= 0 else None

    def run(
        self, op: ConvOp, x: torch.Tensor, b: int, act: torch.Tensor, fresh: torch.Tensor
    ) -> torch.Tensor:
        """``op`` on this frame's ``x`` for slots ``[0, b)``; ``fresh`` marks rows with no samples yet."""
        if op.kind == "fn":
            return op.module(x)
        if op.kind == "res":
            assert op.sub is not None
            y = x
            for s in op.sub:
                y = self.run(s, y, b, act, fresh)
            res = self.run(op.shortcut, x, b, act, fresh) if op.shortcut is not None else x
            return res + y
        if op.kind == "conv":
            st = self.state_of(op, b)
            return causal_conv_step(op.module.conv, x, st, act, fresh if op.replicate else None)
        raise ValueError(f"unknown op kind {op.kind!r}")


@dataclass
class FusedScaledLayer:
    """A pre-norm transformer layer with layer scales (Mimi's, the Qwen3-TTS codec's) regrouped for decode:
    one QKV GEMM, the layer scales fused into the residual adds (``addcmul``)."""

    ln1: Any
    ln2: Any
    w_qkv: torch.Tensor
    b_qkv: torch.Tensor | None
    o_proj: nn.Linear
    ls1: torch.Tensor
    ls2: torch.Tensor
    mlp: Any
    heads: int
    kv_heads: int
    head_dim: int
    scale: float

    @classmethod
    def of(cls, layer: Any) -> FusedScaledLayer:
        att = layer.self_attn
        d = att.head_dim
        w_qkv, b_qkv = fuse_linears(att.q_proj, att.k_proj, att.v_proj)
        with torch.no_grad():
            return cls(
                ln1=layer.input_layernorm,
                ln2=layer.post_attention_layernorm,
                w_qkv=w_qkv,
                b_qkv=b_qkv,
                o_proj=att.o_proj,
                ls1=layer.self_attn_layer_scale.scale,
                ls2=layer.mlp_layer_scale.scale,
                mlp=layer.mlp,
                heads=att.q_proj.out_features // d,
                kv_heads=att.k_proj.out_features // d,
                head_dim=d,
                scale=float(att.scaling),
            )

    def __call__(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        write: Any,
        keys: torch.Tensor,
        values: torch.Tensor,
        mask_add: torch.Tensor,
    ) -> torch.Tensor:
        qk, v = qkv_heads(self.ln1(x), self.w_qkv, self.b_qkv, self.heads, self.kv_heads)
        o = rope_attend(qk, v, self.heads, cos, sin, write, keys, values, mask_add, self.scale)
        x = torch.addcmul(x, self.o_proj(o), self.ls1)
        return torch.addcmul(x, self.mlp(self.ln2(x)), self.ls2)


def ring_mask(
    kpos: torch.Tensor, qpos: torch.Tensor, window: int, active: torch.Tensor, ring: int, heads: int,
    kv_heads: int, dtype: torch.dtype,
) -> KeyMask:  # fmt: skip
    """What queries at ``qpos (b, S)`` see of a ring whose columns hold positions ``kpos (b, L)`` (-1:
    empty): the causal window ``(q - window, q]``. Inactive rows see anything (finite, ignored). Before
    the ring wraps, a row's keys are its first ``pos + S`` columns: the rest are masked, and ``visible``
    says so (the decode kernel does not read them)."""
    kp, q = kpos[:, None, :], qpos[:, :, None]
    mask = (kp >= 0) & (kp <= q) & (kp > q - window)
    mask = mask | ~active[:, None, None]
    visible = torch.where(active, (qpos[:, -1] + 1).clamp(max=ring), kpos.shape[1]).to(torch.int32)
    return KeyMask(additive_mask(mask, kv_heads, heads // kv_heads, dtype), visible)


class RingTransformer:
    """A causal sliding-window transformer decoded a few positions per step for many slots: a ring K/V of
    ``window + positions_per_frame`` columns per layer, with each column's absolute position stored so the
    window mask stays exact after wrap-around. ``pos`` counts each slot's positions so far.

    ``layers`` are duck-typed (``layer(x, cos, sin, write, keys, values, mask_add)``): the codecs' scaled
    layers here, the speech-to-speech temporal transformer's own (``models/s2s``). The K/V rings are kept
    in ``dtype``; a step may read only ring columns ``[0, length)`` (before the ring wraps, the positions
    seen so far), so a young stream does not pay for the whole window. ``kv_dtype`` FP8 (e4m3) keeps them
    quantized with a float32 scale per (slot, head, column) (``kernels.write_columns``): half the bytes
    that decode attention reads, dequantized in its kernel."""

    def __init__(
        self,
        layers: Sequence[FusedScaledLayer],
        slots: int,
        window: int,
        positions_per_frame: int,
        inv_freq: torch.Tensor,
        rope_scale: float,
        device: torch.device,
        dtype: torch.dtype = torch.float32,
        kv_dtype: torch.dtype | None = None,
    ) -> None:
        self.layers = list(layers)
        kv_dtype = kv_dtype or dtype
        if kv_dtype not in (dtype, FP8):
            raise ValueError(f"ring K/V in {kv_dtype}: only the model's {dtype} or {FP8}")
        self.window = window
        self.ring = window + positions_per_frame
        self.k_ring: list[torch.Tensor] = []
        self.v_ring: list[torch.Tensor] = []
        for layer in self.layers:
            shape = (slots, layer.kv_heads, self.ring + 1, layer.head_dim)  # +1 scratch column
            self.k_ring.append(torch.zeros(shape, device=device, dtype=kv_dtype))
            self.v_ring.append(torch.zeros(shape, device=device, dtype=kv_dtype))
        self.scales: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
        if kv_dtype == FP8:
            self.scales = ([torch.zeros(t.shape[:3], device=device) for t in self.k_ring],
                           [torch.zeros(t.shape[:3], device=device) for t in self.v_ring])  # fmt: skip
        self.kpos = torch.full((slots, self.ring + 1), -1, dtype=torch.long, device=device)
        self.pos = torch.zeros(slots, dtype=torch.long, device=device)
        self.inv_freq = inv_freq.detach().float().clone().to(device)
        self.rope_scale = rope_scale
        self.frame_offsets = torch.arange(positions_per_frame, device=device)

    @torch.no_grad()
    def reset(self, slots: torch.Tensor) -> None:
        self.kpos.index_fill_(0, slots, -1)
        self.pos.index_fill_(0, slots, 0)

    def slot_tensors(self) -> list[torch.Tensor]:
        """Every tensor holding per-slot state (slot first): the ring K/V (FP8 as bytes: row moves have no
        FP8 kernels) and their scales, their positions, the counts."""
        rings = [t.view(torch.uint8) if t.dtype == FP8 else t for t in (*self.k_ring, *self.v_ring)]
        scales = [*self.scales[0], *self.scales[1]] if self.scales is not None else []
        return [*rings, *scales, self.kpos, self.pos]

    def __call__(
        self, x: torch.Tensor, b: int, active: torch.Tensor, length: int | None = None
    ) -> torch.Tensor:
        """This frame's positions ``x (b, S, hidden)`` through every layer; advances active slots by S.
        ``length``: ring columns read (default all); it must cover every active row's positions so far."""
        length = self.ring if length is None else length
        s = x.shape[1]
        qpos = self.pos[:b, None] + self.frame_offsets[None, :s]  # (b, S)
        cols = torch.where(active[:, None], qpos % self.ring, self.ring)
        kpos = self.kpos[:b]
        kpos.scatter_(1, cols, qpos)
        l0 = self.layers[0]
        mask = ring_mask(kpos[:, :length], qpos, self.window, active, self.ring, l0.heads, l0.kv_heads, x.dtype)
        cos, sin = rope_cos_sin(qpos, self.inv_freq, self.rope_scale, x.dtype)
        cos, sin = cos[:, :, None], sin[:, :, None]  # (b, S, 1, D): broadcast over heads
        x = layers_at_positions(
            self.layers, x, cos, sin, self.k_ring, self.v_ring, cols, length, mask, self.scales
        )
        self.pos[:b].add_(active.long() * s)
        return x
