"""Why flashtune's prefill kernel took 1.30-1.45x its own bench time inside the recall model (issue 34's
TTFT loss; lab/results/2026-12-07e_h100-visit/), while cuDNN's took its own time and, in llama3-8b-like
at batch 1, flashtune's did too. One process, the profile given (default: the GPU's own):

1. the attention alone, flashtune beside cuDNN, on the bench's contiguous (batch, seqlen, heads, d)
   inputs and on the layout transformers hands over (q a view of its projection's output; k and v the
   dynamic cache's (batch, heads, seqlen, d) tensors, which torch.cat made, as views): the recall
   model's shape (batch 10, 4/2 heads of 128, causal, 4k and 16k) and llama3-8b-like's (1, 32/8, 16k);
2. the recall model itself (random weights, bf16), one prefill per backend under the profiler: each
   attention kernel's time, and the kernel that ran just before it.

    PYTHONPATH=. python3 lab/model_layout.py [PROFILE] [OUT.json]
"""
import json
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashtune.measure.timing import time_ms
from flashtune.runtime import ops

SHAPES = [("recall 4k", 10, 4, 2, 4096), ("recall 16k", 10, 4, 2, 16384), ("llama3-8b 16k", 1, 32, 8, 16384)]


def inputs(batch: int, heads: int, heads_kv: int, seqlen: int, layout: str):
    """q, k, v as flash_attn takes them, (batch, seqlen, heads, d), in memory laid out as `layout` says."""
    def rand(h):
        return torch.randn(batch, seqlen, h, 128, device="cuda", dtype=torch.bfloat16)
    q, k, v = rand(heads), rand(heads_kv), rand(heads_kv)
    if layout == "model":  # k, v: contiguous (batch, heads, seqlen, d), seen through a transpose
        k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k, v))
    return q, k, v


def attention_alone() -> list[dict]:
    rows = []
    for name, batch, heads, heads_kv, seqlen in SHAPES:
        row = {"shape": name}
        for layout in ("contiguous", "model"):
            sets = [inputs(batch, heads, heads_kv, seqlen, layout) for _ in range(2)]
            runs = [lambda s=s: ops.flash_attn_func(*s, causal=True) for s in sets]
            row[f"flashtune {layout} ms"] = statistics.median(time_ms(runs, 5, 20))
            print(name, layout, f"k strides {sets[0][1].stride()}", f"{row[f'flashtune {layout} ms']:.3f} ms",
                  flush=True)
        sdpa = [tuple(t.transpose(1, 2) for t in inputs(batch, heads, heads_kv, seqlen, "contiguous"))
                for _ in range(2)]
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            runs = [lambda s=s: F.scaled_dot_product_attention(*s, is_causal=True, enable_gqa=True) for s in sdpa]
            row["cudnn ms"] = statistics.median(time_ms(runs, 5, 20))
        print(name, "cudnn", f"{row['cudnn ms']:.3f} ms", flush=True)
        rows.append(row)
    return rows


def in_model(length: int) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    from flashtune import hf
    from flashtune.measure.recall_model import Recipe, build

    model = build(Recipe(), torch.bfloat16).cuda().eval()
    ids = torch.randint(1, 100, (10, length), device="cuda")
    rows = []
    for impl, pattern in ((hf.NAME, "flashtune_"), ("sdpa", "cudnn")):
        model.set_attn_implementation(impl)
        context = sdpa_kernel([SDPBackend.CUDNN_ATTENTION]) if impl == "sdpa" else torch.no_grad()
        with context, torch.no_grad():
            for _ in range(3):
                model(ids, use_cache=True, logits_to_keep=1)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                model(ids, use_cache=True, logits_to_keep=1)
                torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
        for i, e in enumerate(kernels):
            if pattern in e.name:
                before = kernels[i - 1] if i else None
                rows.append({"impl": impl, "length": length, "kernel": e.name[:90], "us": e.device_time,
                             "before": before.name[:90] if before else None,
                             "before_us": before.device_time if before else None})
                print(impl, length, f"{e.device_time:9.1f} us", e.name[:70], "| before:",
                      before.name[:50] if before else None, flush=True)
    return rows


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] != "-":
        ops.use_profile(sys.argv[1])
    result = {"gpu": torch.cuda.get_device_name(), "profile": ops.active_profile().name,
              "alone": attention_alone(), "in_model": in_model(4096) + in_model(16384)}
    if len(sys.argv) > 2:
        json.dump(result, open(sys.argv[2], "w"), indent=1)


if __name__ == "__main__":
    main()
