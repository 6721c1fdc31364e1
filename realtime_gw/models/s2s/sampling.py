"""Moshi's sampling (``moshi.utils.sampling.sample_token``: softmax at a temperature, top-k, one draw by
the exponential race ``argmax(p / E)``), with the randomness a pure function of (stream seed, step,
channel, rank) instead of a device generator's sequence.

So a stream's samples do not depend on which other streams share its batch, on its slot, or on the batch
bucket it ran in (a stream that joins or leaves mid-batch changes nothing for the others), a seed replays
a conversation exactly, and the whole draw is plain tensor arithmetic on the device (no generator state:
it records into a CUDA graph). The draw has the distribution of ``torch.multinomial`` over the top-k
probabilities, the same as the reference's; the particular tokens differ from a reference run with a
torch generator. A temperature <= 0 is greedy (``argmax``), as the reference's ``use_sampling=False``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_M32 = 0xFFFFFFFF
_MUL = 0x045D9F3B


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (values in [0, 2^32)) in int64 arithmetic: no product overflows."""
    x = (((x >> 16) ^ x) * _MUL) & _M32
    x = (((x >> 16) ^ x) * _MUL) & _M32
    return (x >> 16) ^ x


def uniforms(seeds: torch.Tensor, steps: torch.Tensor, channel: int, n: int) -> torch.Tensor:
    """``(b, n)`` uniforms in (0, 1) for each row's (seed, step) at ``channel``, ranks ``0..n-1``."""
    rank = torch.arange(n, device=seeds.device, dtype=torch.long)
    base = _mix32((_mix32(seeds & _M32) + steps) & _M32)
    h = _mix32((base[:, None] + (channel << 20) + rank[None]) & _M32)
    return ((h >> 8).float() + 0.5) * (1.0 / (1 << 24))


@dataclass(frozen=True)
class Sampler:
    """One channel's sampling as published: ``temperature`` and ``top_k`` (0 = the whole vocabulary)."""

    temperature: float
    top_k: int

    def __call__(
        self, logits: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor, channel: int
    ) -> torch.Tensor:
        """``logits (b, V)`` -> tokens ``(b,)``."""
        logits = logits.float()
        if self.temperature <= 0.0:
            return logits.argmax(dim=-1)
        k = logits.shape[-1] if self.top_k <= 0 else min(self.top_k, logits.shape[-1])
        vals, idx = torch.topk(logits, k, dim=-1)
        probs = torch.softmax(vals / self.temperature, dim=-1)
        race = probs / -torch.log(uniforms(seeds, steps, channel, k))  # p / Exp(1)
        return idx.gather(1, race.argmax(dim=-1, keepdim=True))[:, 0]
