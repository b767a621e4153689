"""`kivi2`, `kivi4`, `kivi8`: KIVI's asymmetric quantization of the cache (Liu et al. 2024, "KIVI: A Tuning-Free
Asymmetric 2bit Quantization for KV Cache"), simulated exactly on any device: each quantized number is replaced by
what its b-bit code dequantizes to, so the continuation attends to the very values a KIVI cache would hold.

Asymmetric quantization of a group x of numbers: zero-point z = min x, scale s = (max x − min x)/(2^b − 1), code
c = round((x − z)/s) clamped to 0 … 2^b − 1 (round half to even, torch's and numpy's rounding), value c·s + z (a
group whose numbers are all equal keeps them: s = 0). The groups are KIVI's (its Algorithm 1, prefill):

- keys *per channel*: each key channel of each key/value head is cut along the tokens into groups of G consecutive
  tokens (keys have outlier channels: a channel's own range keeps the others fine). Keys are quantized R tokens at a
  time, so after a prefill of L tokens the first L − (L mod R) are quantized and the last L mod R stay in full
  precision;
- values *per token*: each value row is cut along its d channels into groups of G (the last group shorter when G
  does not divide d); the most recent R tokens' values stay in full precision.

KIVI's defaults: G = 32, R = 128. What the cache stores per key/value head (`stored`, bytes): the codes, b bits each
(⌈bits/8⌉ per tensor), a scale and a zero-point per group at the cache's dtype, and the full-precision rows. The
ratio does not change these presses — the bits are in the name; `saved` is the share of the context cache's bytes
saved (1 − stored / full), which is what to compare them on. Every token stays, keys keep their RoPE rotation (KIVI
quantizes post-RoPE keys), and the continuation's own keys and values are not quantized (as KIVI's residual).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .base import Compressed, Prefill, Press, full_memory, register

#: where this file's presses come in listings (`spectra.registry` reads it, and each class's facts, from the source)
ORDER = 65

#: KIVI's defaults: numbers per quantization group, and the tokens quantized at a time (the full-precision residual)
GROUP, RESIDUAL = 32, 128


def fake_quantize(x: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """x (…, n) with every group of `group` consecutive numbers along the last axis (the last one shorter when
    `group` does not divide n) replaced by its asymmetric `bits`-bit quantization, dequantized (see the module
    docstring); computed in x's dtype, as a cache of that dtype stores its scales and zero-points."""
    if x.shape[-1] == 0:
        return x.clone()
    levels = 2 ** bits - 1
    parts = []
    for part in torch.split(x, group, dim=-1):
        low, high = part.amin(dim=-1, keepdim=True), part.amax(dim=-1, keepdim=True)
        scale = (high - low) / levels
        codes = torch.where(scale > 0, torch.round((part - low) / torch.where(scale > 0, scale, 1)), 0)
        parts.append(codes.clamp(0, levels) * scale + low)
    return torch.cat(parts, dim=-1)


def split_points(length: int, residual: int) -> tuple[int, int]:
    """(keys quantized, values quantized) after a prefill of `length` tokens: the first L − (L mod R) keys and the
    first max(L − R, 0) values (KIVI's Algorithm 1)."""
    return length - length % residual, max(length - residual, 0)


def quantized_bytes(rows: int, columns: int, group: int, bits: int, itemsize: int) -> int:
    """Bytes of a rows × columns block quantized in groups of `group` along its columns: the codes (bits each, the
    block's bits rounded up to a byte) and one scale and one zero-point per group at `itemsize` bytes."""
    groups = rows * -(-columns // group)
    return -(-rows * columns * bits // 8) + 2 * groups * itemsize


@register
@dataclass(frozen=True)
class Kivi(Press):
    """KIVI at `bits` bits: keys per channel, values per token, in groups of `group`, the last `residual` tokens
    (keys: L mod `residual`) in full precision. Registered at 2, 4 and 8 bits (`variants`: kivi2, kivi4, kivi8)."""

    bits: int
    group: int = GROUP
    residual: int = RESIDUAL
    #: each variant's bits, and its summary as a literal for --help (the instance states it: `summary` below)
    variants = {
        "kivi2": {"bits": 2, "summary": "every token at 2 bits, as KIVI quantizes: keys per channel, values per "
                                        "token, groups of 32, the last 128 tokens whole"},
        "kivi4": {"bits": 4, "summary": "every token at 4 bits, as KIVI quantizes: keys per channel, values per "
                                        "token, groups of 32, the last 128 tokens whole"},
        "kivi8": {"bits": 8, "summary": "every token at 8 bits, as KIVI quantizes: keys per channel, values per "
                                        "token, groups of 32, the last 128 tokens whole"},
    }
    peer: ClassVar[str] = ""
    axis: ClassVar[str] = "bits"
    ratio_means: ClassVar[str] = "ignored (the bits are in the name)"

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"kivi{self.bits}"

    @property
    def summary(self) -> str:  # type: ignore[override]
        return (f"every token at {self.bits} bits, as KIVI quantizes: keys per channel, values per token, groups of "
                f"{self.group}, the last {self.residual} tokens whole")

    def fresh(self) -> Kivi:
        return self

    def compress(self, prefill: Prefill, ratio: float) -> Compressed:
        keys_quantized, values_quantized = split_points(prefill.length, self.residual)
        key, value = prefill.key.clone(), prefill.value.clone()
        # per channel: a key channel's groups run along the tokens
        key[:, :keys_quantized] = fake_quantize(prefill.key[:, :keys_quantized].transpose(-1, -2), self.bits,
                                                self.group).transpose(-1, -2)
        value[:, :values_quantized] = fake_quantize(prefill.value[:, :values_quantized], self.bits, self.group)
        stored = self.memory(prefill)
        every = torch.arange(prefill.length, device=key.device).expand(prefill.kv_heads, -1)
        return Compressed(every, 1 - stored / full_memory(prefill), key=key, value=value,
                          stored=torch.full((prefill.kv_heads,), stored, dtype=torch.int64))

    def memory(self, prefill: Prefill) -> int:
        """Bytes of one key/value head's KIVI cache of the prefill's L tokens (see the module docstring)."""
        length, itemsize = prefill.length, prefill.key.element_size()
        key_dim, value_dim = prefill.key.shape[-1], prefill.value.shape[-1]
        keys_quantized, values_quantized = split_points(length, self.residual)
        keys = (quantized_bytes(key_dim, keys_quantized, self.group, self.bits, itemsize)
                + (length - keys_quantized) * key_dim * itemsize)
        values = (quantized_bytes(values_quantized, value_dim, self.group, self.bits, itemsize)
                  + (length - values_quantized) * value_dim * itemsize)
        return keys + values
