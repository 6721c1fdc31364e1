"""The Base checkpoint's speaker encoder: a reference WAV -> the x-vector that stands for the voice.

``speaker_encoder.*`` of a Base ``model.safetensors`` is an ECAPA-TDNN (Desplanques et al., 2020): a TDNN,
SE-Res2Net blocks, multi-layer feature aggregation, attentive statistics pooling and a 1x1 projection to
the talker's width. Its input is a log-mel spectrogram of 24 kHz audio (n_fft 1024, hop 256, 128 Slaney
mels over 0..12 kHz, reflect padding, magnitude with a 1e-9 floor, log clamped at 1e-5), as the reference's
``extract_speaker_embedding`` computes it; the Slaney filterbank is built here as librosa's ``filters.mel``
builds it (float64 math, float32 storage), so the features equal the reference's.

The talker takes the x-vector in place of a speaker's codec embedding (``engine.build_prompt``).
Computed once per registered voice at start-up, not per request: none of this is on a hot path.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

SPEAKER_RATE = 24000
MEL = {"n_fft": 1024, "num_mels": 128, "hop": 256, "win": 1024, "fmin": 0.0, "fmax": 12000.0}


# -- features ---------------------------------------------------------------------------------------------------
def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    """Slaney's mel scale (librosa ``htk=False``): linear below 1 kHz, logarithmic above."""
    f = np.asarray(f, dtype=np.float64)
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0
    return np.where(
        f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, f / f_sp
    )


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)


def mel_filterbank(sr: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> np.ndarray:
    """``librosa.filters.mel(sr=, n_fft=, n_mels=, fmin=, fmax=)`` (Slaney scale and area norm), float32."""
    weights = np.zeros((n_mels, 1 + n_fft // 2), dtype=np.float32)
    fftfreqs = np.fft.rfftfreq(n=n_fft, d=1.0 / sr)
    mel_f = _mel_to_hz(np.linspace(_hz_to_mel(fmin), _hz_to_mel(fmax), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = np.subtract.outer(mel_f, fftfreqs)
    for i in range(n_mels):
        lower = -ramps[i] / fdiff[i]
        upper = ramps[i + 2] / fdiff[i + 1]
        weights[i] = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_f[2 : n_mels + 2] - mel_f[:n_mels]))[:, np.newaxis]
    return weights


def log_mel(wav: torch.Tensor) -> torch.Tensor:
    """``(T,)`` float32 audio at 24 kHz -> ``(frames, 128)`` log-mel features (the reference's, transposed)."""
    m = MEL
    basis = torch.from_numpy(mel_filterbank(SPEAKER_RATE, m["n_fft"], m["num_mels"], m["fmin"], m["fmax"]))
    window = torch.hann_window(m["win"])
    pad = (m["n_fft"] - m["hop"]) // 2
    y = F.pad(wav[None, None], (pad, pad), mode="reflect")[:, 0]
    spec = torch.stft(y, m["n_fft"], hop_length=m["hop"], win_length=m["win"], window=window, center=False,
                      normalized=False, onesided=True, return_complex=True)  # fmt: skip
    spec = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    return torch.log(torch.clamp(torch.matmul(basis, spec), min=1e-5))[0].T


# -- the network (parameter names as published) ----------------------------------------------------------------
def _conv(c_in: int, c_out: int, k: int, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(c_in, c_out, k, dilation=dilation, padding="same", padding_mode="reflect")


class Tdnn(nn.Module):
    def __init__(self, c_in: int, c_out: int, k: int, dilation: int) -> None:
        super().__init__()
        self.conv = _conv(c_in, c_out, k, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


class Res2Net(nn.Module):
    def __init__(self, channels: int, scale: int, k: int, dilation: int) -> None:
        super().__init__()
        self.scale = scale
        self.blocks = nn.ModuleList(
            Tdnn(channels // scale, channels // scale, k, dilation) for _ in range(scale - 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts: list[torch.Tensor] = []
        for i, part in enumerate(torch.chunk(x, self.scale, dim=1)):
            parts.append(part if i == 0 else self.blocks[i - 1](part if i == 1 else part + parts[-1]))
        return torch.cat(parts, dim=1)


class SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, se_channels: int) -> None:
        super().__init__()
        self.conv1 = _conv(channels, se_channels, 1)
        self.conv2 = _conv(se_channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.relu(self.conv1(x.mean(dim=2, keepdim=True)))
        return x * torch.sigmoid(self.conv2(s))


class SeRes2NetBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, scale: int, se_channels: int, k: int, dilation: int) -> None:
        super().__init__()
        self.tdnn1 = Tdnn(c_in, c_out, 1, 1)
        self.res2net_block = Res2Net(c_out, scale, k, dilation)
        self.tdnn2 = Tdnn(c_out, c_out, 1, 1)
        self.se_block = SqueezeExcitation(c_out, se_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x)))) + x


def _stats(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-12) -> tuple[torch.Tensor, torch.Tensor]:
    mean = (w * x).sum(2)
    std = torch.sqrt((w * (x - mean.unsqueeze(2)).pow(2)).sum(2).clamp(eps))
    return mean, std


class AttentiveStatsPool(nn.Module):
    """Mean and std over time weighted by a learned attention (whole utterance: no padding mask)."""

    def __init__(self, channels: int, attention_channels: int) -> None:
        super().__init__()
        self.tdnn = Tdnn(channels * 3, attention_channels, 1, 1)
        self.conv = _conv(attention_channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[-1]
        uniform = torch.ones(x.shape[0], 1, n, dtype=x.dtype, device=x.device)
        mean, std = _stats(x, uniform / uniform.sum(dim=2, keepdim=True))
        context = torch.cat(
            [x, mean.unsqueeze(2).expand(-1, -1, n), std.unsqueeze(2).expand(-1, -1, n)], dim=1
        )
        attention = torch.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = _stats(x, attention)
        return torch.cat((mean, std), dim=1).unsqueeze(2)


class SpeakerEncoder(nn.Module):
    """``speaker_encoder.*``: ``(b, frames, mel_dim)`` log-mels -> ``(b, enc_dim)`` x-vectors."""

    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        ch, ks, dil = c["enc_channels"], c["enc_kernel_sizes"], c["enc_dilations"]
        if not len(ch) == len(ks) == len(dil):
            raise ValueError(
                "speaker_encoder_config: enc_channels, enc_kernel_sizes, enc_dilations differ in length"
            )
        self.config = c
        blocks: list[nn.Module] = [Tdnn(c["mel_dim"], ch[0], ks[0], dil[0])]
        blocks += [
            SeRes2NetBlock(ch[i - 1], ch[i], c["enc_res2net_scale"], c["enc_se_channels"], ks[i], dil[i])
            for i in range(1, len(ch) - 1)
        ]
        self.blocks = nn.ModuleList(blocks)
        self.mfa = Tdnn(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = AttentiveStatsPool(ch[-1], c["enc_attention_channels"])
        self.fc = _conv(ch[-1] * 2, c["enc_dim"], 1)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        x = mels.transpose(1, 2)
        outs = []
        for block in self.blocks:
            x = block(x)
            outs.append(x)
        x = self.mfa(torch.cat(outs[1:], dim=1))
        return self.fc(self.asp(x)).squeeze(-1)


@torch.no_grad()
def speaker_embedding(encoder: SpeakerEncoder, wav: np.ndarray) -> torch.Tensor:
    """The x-vector ``(enc_dim,)`` of mono float32 audio at 24 kHz (``SPEAKER_RATE``)."""
    p = next(encoder.parameters())
    mels = log_mel(torch.from_numpy(np.ascontiguousarray(wav, dtype=np.float32)))
    return encoder(mels[None].to(device=p.device, dtype=p.dtype))[0]
