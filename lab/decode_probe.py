"""A first look at decode speed on the device (before `flashtune bench --decode` exists): the cells
of issue 33's table, flashtune's flash_attn_with_kvcache (contiguous and paged caches) beside
SDPA's backends, GB/s of K/V read and the fraction of a device-to-device copy in the same process.

Usage: PYTHONPATH=. python3 lab/decode_probe.py OUT.json [--quick]
"""
import json
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashtune
from flashtune.measure.timing import time_ms

CASES = [  # (heads_kv, batch, cache, seqlen_q)
    (8, 1, 16384, 1), (8, 1, 131072, 1), (8, 8, 16384, 1), (8, 32, 16384, 1), (8, 64, 32768, 1),
    (32, 1, 16384, 1), (32, 64, 32768, 1), (1, 8, 16384, 1), (8, 1, 16384, 4), (8, 32, 16384, 4),
]
PAGED = [(8, 8, 16384, 1), (8, 1, 131072, 1)]
HEADS, HDIM, DTYPE = 32, 128, torch.bfloat16


def copy_gbps() -> float:
    x = torch.empty(2 ** 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = statistics.median(time_ms([lambda: y.copy_(x)], 3, 20))
    return 2 * x.numel() / ms / 1e6


def sdpa_runner(q, k, v, backend, causal):
    # GQA as SDPA takes it (enable_gqa); flash and efficient refuse it on dense inputs, so for them
    # K/V are repeated to every head, outside the timing
    ratio = q.shape[2] // k.shape[2]
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    gqa = backend in (None, SDPBackend.CUDNN_ATTENTION)
    if not gqa:
        kt, vt = kt.repeat_interleave(ratio, dim=1), vt.repeat_interleave(ratio, dim=1)
    mask = None
    if causal:
        from torch.nn.attention.bias import causal_lower_right
        mask = causal_lower_right(q.shape[1], k.shape[1])

    def run():
        if backend is None:  # PyTorch's own choice
            return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=gqa)
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=gqa)
    return run


def main():
    out_path = sys.argv[1]
    copy = copy_gbps()
    rows = []
    for heads_kv, batch, cache, sq, paged in [c + (False,) for c in CASES] + [c + (True,) for c in PAGED]:
        kv_bytes = 2 * batch * cache * heads_kv * HDIM * 2
        sets = max(1, min(4, (200 << 20) // kv_bytes))
        inputs = []
        for _ in range(sets):
            q = torch.randn(batch, sq, HEADS, HDIM, device="cuda", dtype=DTYPE)
            k = torch.randn(batch, cache, heads_kv, HDIM, device="cuda", dtype=DTYPE)
            v = torch.randn(batch, cache, heads_kv, HDIM, device="cuda", dtype=DTYPE)
            inputs.append((q, k, v))
        causal = sq > 1
        runners = {"flashtune": [lambda q=q, k=k, v=v: flashtune.flash_attn_with_kvcache(q, k, v, causal=causal)
                                 for q, k, v in inputs]}
        for page in ((256, 64, 16, 1) if paged else ()):
            paged_inputs = []
            for q, k, v in inputs:
                pages = batch * cache // page
                kp = k.reshape(pages, page, heads_kv, HDIM)
                vp = v.reshape(pages, page, heads_kv, HDIM)
                table = torch.randperm(pages, device="cuda").to(torch.int32).view(batch, -1)  # shuffled pages
                paged_inputs.append((q, kp, vp, table))
            runners[f"flashtune-page{page}"] = [
                lambda q=q, k=k, v=v, t=t: flashtune.flash_attn_with_kvcache(q, k, v, block_table=t, causal=causal)
                for q, k, v, t in paged_inputs]
        for name, backend in (("sdpa-default", None), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)):
            if kv_bytes * HEADS // heads_kv < 40e9:
                runners[name] = [sdpa_runner(q, k, v, backend, causal) for q, k, v in inputs[:1]]
        row = dict(heads_kv=heads_kv, batch=batch, cache=cache, sq=sq, kv_GB=kv_bytes / 1e9, paged=paged)
        for name, rs in runners.items():
            try:
                ms = statistics.median(time_ms(rs, 3, 10, warmup_seconds=0.05))
                row[name] = dict(us=ms * 1e3, GBps=kv_bytes / ms / 1e6)
            except Exception as e:  # a backend that refuses the case
                row[name] = dict(error=str(e).splitlines()[0][:120])
        rows.append(row)
        ft = row["flashtune"].get("GBps", 0)
        best = max(row[n].get("GBps", 0) for n in runners if n.startswith("sdpa"))
        extra = " ".join(f"{n[10:]}={row[n].get('GBps', 0):.0f}" for n in runners if n.startswith("flashtune-"))
        print(f"kv{heads_kv:>2} b{batch:>3} {cache:>6} sq{sq} {kv_bytes / 1e9:5.2f}GB flashtune {ft:6.0f} GB/s "
              f"({ft / copy:4.0%} copy) best-sdpa {best:6.0f} ratio {ft / best if best else 0:5.2f} {extra}", flush=True)
    json.dump(dict(copy_GBps=copy, gpu=torch.cuda.get_device_name(), rows=rows), open(out_path, "w"), indent=1)
    print(f"copy {copy:.0f} GB/s")


if __name__ == "__main__":
    main()
