"""The attention variants a kernel can be built with (csrc/common/variants.h's `Variants`): each a
template switch of every family's traits, a part of the kernel's name, and off by default (the
plain kernel, instruction for instruction)."""
from __future__ import annotations

from typing import NamedTuple


class Variants(NamedTuple):
    softcap: bool = False  # scaled scores S -> cap * tanh(S / cap) (Gemma 2)
    window: bool = False   # a sliding window (Mistral, Gemma, gpt-oss): blocks outside skipped
    sinks: bool = False    # a logit per query head joining every row's softmax (gpt-oss)
    alibi: bool = False    # -slope * |i' - j| added to the scores (BLOOM, MPT; flash_attn's alibi_slopes)

    @property
    def names(self) -> list[str]:
        """The kernel name's parts, in order."""
        return [name for name, on in zip(("softcap", "swa", "sinks", "alibi"), self) if on]

    def cpp(self) -> str:
        return "flashtune::Variants<" + ", ".join("true" if on else "false" for on in self) + ">"


NO_VARIANTS = Variants()
