"""Does a torch profiler session slow the launches after it? (bench --model's 1k TTFT of 2026-12-07:
32.6 ms for the backend timed before any profiling, 68-74 ms for those after.) In one fresh process:
the host ms of one call (flashtune.measure.timing.host_ms_per_call: launches behind a spin kernel)
and the GPU ms of a launch-bound burst (200 tiny adds, CUDA events), for flashtune's decode call and
SDPA's, before and after one kernel_names() call. Run it twice, the second time with
TEARDOWN_CUPTI=1 (kineto then detaches CUPTI when a session ends):

    PYTHONPATH=. python3 lab/cupti_host.py
    TEARDOWN_CUPTI=1 PYTHONPATH=. python3 lab/cupti_host.py
"""
import os
import time

import torch

import flashtune
from flashtune.measure.timing import host_ms_per_call, kernel_names

q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, 16384, 8, 128, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
seqlens = torch.full((1,), 16384, dtype=torch.int32, device="cuda")
x = torch.zeros(1024, device="cuda")
calls = {
    "flashtune decode": lambda: flashtune.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens),
    "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True),
}


def burst_ms() -> float:  # wall time of 200 tiny launches: launch-bound
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(200):
        x.add_(1)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def measure(label: str) -> None:
    for name, call in calls.items():
        call()
        host = min(host_ms_per_call([call]) for _ in range(5))
        print(f"{label:28} {name:18} host {host * 1e3:7.1f} us", flush=True)
    print(f"{label:28} {'200 adds':18} wall {min(burst_ms() for _ in range(5)):7.3f} ms", flush=True)


print("TEARDOWN_CUPTI =", os.environ.get("TEARDOWN_CUPTI"))
measure("before any profiler")
names = kernel_names(calls["flashtune decode"])
print("kernel_names:", names)
measure("after one profiler session")
names = kernel_names(calls["flashtune decode"])
print("kernel_names again:", names)
