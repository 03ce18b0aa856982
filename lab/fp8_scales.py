"""How far finer FP8 scales and K smoothing can cut FP8 Q/K attention error (issue 36's item 3),
measured on the CPU in fp32 math: the error of attention on e4m3-quantised q and k against fp32 on
the originals (v stays 16-bit, as in the Q/K recipe), for scale granularities from per (batch,
head) down to per token, with and without K's mean over tokens subtracted (exact for softmax:
it shifts each row's scores by a constant). Inputs: flashtune/measure/fp8_floor.py's kinds.

    PYTHONPATH=. python3 lab/fp8_scales.py > lab/results/<date>_fp8-scales.json
"""
from __future__ import annotations

import json
import sys

import torch

from flashtune.measure import fp8_floor
from flashtune.measure.reference import attention_reference, rel_l2

FP8 = torch.float8_e4m3fn


def quantised(x: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """x through e4m3 with one absmax scale per slice over `dims` (x: (b, s, h, d))."""
    descale = x.abs().amax(dim=dims, keepdim=True).clamp_min(1e-12) / 448
    return (x / descale).to(FP8).float() * descale


def blocks(x: torch.Tensor, rows: int) -> torch.Tensor:
    """Per block of `rows` tokens: quantised with one scale per (batch, block, head)."""
    b, s, h, d = x.shape
    return quantised(x.reshape(b, s // rows, rows, h, d), (2, 4)).reshape(x.shape)


def main() -> None:
    rows = []
    for kind in fp8_floor.INPUT_KINDS:
        for hdim in (64, 128):
            g = torch.Generator().manual_seed(0)
            q, k, v = fp8_floor.inputs(kind, 2, 1024, 1024, 8, 2, hdim, torch.float32, "cpu", g)
            ref, _ = attention_reference(q, k, v, True)
            smooth = k - k.mean(dim=1, keepdim=True)
            recipes = {
                "per head": (quantised(q, (1, 3)), quantised(k, (1, 3))),
                "K smoothing": (quantised(q, (1, 3)), quantised(smooth, (1, 3))),
                "Q blocks of 64": (blocks(q, 64), quantised(k, (1, 3))),
                "K smoothing + Q/K blocks of 64": (blocks(q, 64), blocks(smooth, 64)),
                "K smoothing + per-token Q and K": (quantised(q, (3,)), quantised(smooth, (3,))),
            }
            errors = {name: rel_l2(attention_reference(qq, kk, v, True)[0], ref) for name, (qq, kk) in recipes.items()}
            base = errors["per head"]
            rows.append({"inputs": kind, "hdim": hdim, "rel_l2": {n: round(e, 4) for n, e in errors.items()},
                         "cut_vs_per_head": {n: round(base / e, 2) for n, e in errors.items()}})
    json.dump({"command": "PYTHONPATH=. python3 lab/fp8_scales.py", "device": "CPU, fp32 math",
               "shape": "batch 2, 1024 queries and keys, 8 query heads, 2 KV heads, causal", "rows": rows},
              sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
