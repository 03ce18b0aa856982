"""Why flashtune's prefill kernel took 1.30-1.45x its own bench time inside the recall model (issue 34's
TTFT loss; lab/results/2026-12-07e_h100-visit/), while cuDNN's took its own time and, in llama3-8b-like
at batch 1, flashtune's did too. One process, the profile given (default: the GPU's own):

1. the attention alone, flashtune beside cuDNN, on the bench's contiguous (batch, seqlen, heads, d)
   inputs and on the layout transformers hands over (q a view of its projection's output; k and v the
   dynamic cache's (batch, heads, seqlen, d) tensors, which torch.cat made, as views): the recall
   model's shape (batch 10, 4/2 heads of 128, causal, 4k and 16k) and llama3-8b-like's (1, 32/8, 16k);
2. the recall model itself (random weights, bf16), one prefill per backend under the profiler: each
   attention kernel's time, and the kernel that ran just before it; the forward's wall time, its
   kernels' busy time and each kernel name's total (where the rest of a TTFT difference goes: on an
   H100 the kernel took less than cuDNN's inside the model, 2026-12-07f);
3. decode, llama3-8b-like (1 x 32/8 heads of 128, one query token, 16k and 64k keys): the bench's
   call (flash_attn_with_kvcache on a (batch, seqlen, heads, d) cache) beside the model's
   (padded_cache_decode on a static cache's (batch, heads, seqlen, d) buffer, its end a device
   tensor, with and without a first), CUDA-event times; and one call's kernels under the profiler,
   their durations summed and as busy time (the combine kernel waits inside the split kernel's
   interval: the model bench's decode GB/s summed them until 2026-12-07f).

    PYTHONPATH=. python3 lab/model_layout.py [PROFILE] [OUT.json] [trained]

`trained`: step 2 alone, with the bench's trained recall model and its prompts beside random weights (the
kernel's speculative step, spec_max, fails its vote on a trained model's sharp attention: lab/spec_vote.py).
"""
import json
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashtune.commands.bench_model import busy_time
from flashtune.measure.timing import time_ms
from flashtune.runtime import kvcache, ops

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


def in_model(length: int, trained: bool = False) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    from flashtune import hf
    from flashtune.measure.recall_model import Recipe, build

    if trained:  # the bench's own: its trained weights (trained here first, ~100 s, then cached) and prompts
        from flashtune.commands.bench_model import _subject
        subject = _subject("recall", None, "bfloat16", "cuda", 0, None)
        model, ids = subject.model, subject.prompts(10, length)
    else:
        model = build(Recipe(), torch.bfloat16).cuda().eval()
        ids = torch.randint(1, 100, (10, length), device="cuda")
    rows = []
    for impl, pattern in ((hf.NAME, "flashtune_"), ("sdpa", "cudnn")):
        model.set_attn_implementation(impl)
        context = (lambda: sdpa_kernel([SDPBackend.CUDNN_ATTENTION])) if impl == "sdpa" else torch.no_grad
        with context(), torch.no_grad():  # timed before the profiler, whose callbacks slow launches after it
            wall = statistics.median(time_ms([lambda: model(ids, use_cache=True, logits_to_keep=1)], 2, 5))
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                model(ids, use_cache=True, logits_to_keep=1)
                torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
        totals = {}
        for e in kernels:
            totals[e.name[:70]] = totals.get(e.name[:70], 0.0) + e.device_time
        busy = busy_time([(e.time_range.start, e.time_range.end) for e in kernels]) / 1e3
        top = dict(sorted(totals.items(), key=lambda kv: -kv[1])[:25])
        rows.append({"impl": impl, "length": length, "trained": trained, "forward ms": wall, "busy ms": busy,
                     "kernel totals us": top})
        print(impl, length, "trained" if trained else "random", f"forward {wall:.3f} ms, kernels busy {busy:.3f} ms",
              flush=True)
        for i, e in enumerate(kernels):
            if pattern in e.name:
                before = kernels[i - 1] if i else None
                rows.append({"impl": impl, "length": length, "kernel": e.name[:90], "us": e.device_time,
                             "before": before.name[:90] if before else None,
                             "before_us": before.device_time if before else None})
                print(impl, length, f"{e.device_time:9.1f} us", e.name[:70], "| before:",
                      before.name[:50] if before else None, flush=True)
    return rows


def decode_calls() -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    rows = []
    for keys in (16384, 65536):
        q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
        contiguous = [torch.randn(1, keys, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        buffer = [torch.randn(1, 8, keys + 256, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
                  for _ in range(2)]  # a static cache's layout, room for 256 more tokens
        end = torch.tensor([keys], device="cuda", dtype=torch.int32)
        first = torch.zeros(1, device="cuda", dtype=torch.int32)
        scale = 128 ** -0.5
        calls = {
            "flash_attn_with_kvcache": lambda: kvcache.flash_attn_with_kvcache(q, *contiguous, cache_seqlens=keys,
                                                                              causal=True),
            "padded_cache_decode, end": lambda: kvcache.padded_cache_decode(q, *buffer, None, end, scale, True),
            "padded_cache_decode, first and end": lambda: kvcache.padded_cache_decode(q, *buffer, first, end,
                                                                                      scale, True),
        }
        row = {"keys": keys, "kv MB": 2 * keys * 8 * 128 * 2 / 1e6}
        for name, call in calls.items():
            ms = statistics.median(time_ms([call], 5, 50))
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                call()
                torch.cuda.synchronize()
            kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
            summed = sum(e.device_time for e in kernels) / 1e3
            busy = busy_time([(e.time_range.start, e.time_range.end) for e in kernels]) / 1e3
            row[name] = {"ms": ms, "GB/s": row["kv MB"] / ms, "kernels summed ms": summed,
                         "kernels busy ms": busy, "kernels": [e.name[:60] for e in kernels]}
            print(f"decode {keys} {name}: {ms * 1e3:.1f} us ({row['kv MB'] / ms:,.0f} GB/s); kernels summed "
                  f"{summed * 1e3:.1f} us, busy {busy * 1e3:.1f} us", flush=True)
        rows.append(row)
    return rows


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] != "-":
        ops.use_profile(sys.argv[1])
    result = {"gpu": torch.cuda.get_device_name(), "profile": ops.active_profile().name}
    if sys.argv[3:] == ["trained"]:  # the recall model's forward alone, random weights beside trained ones
        result["in_model"] = [row for length in (4096, 16384) for trained in (False, True)
                              for row in in_model(length, trained)]
    else:
        result.update(alone=attention_alone(), in_model=in_model(4096) + in_model(16384), decode=decode_calls())
    if len(sys.argv) > 2:
        json.dump(result, open(sys.argv[2], "w"), indent=1)


if __name__ == "__main__":
    main()
