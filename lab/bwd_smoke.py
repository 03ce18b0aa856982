"""One backward call per head dim and mask under a profile: dq, dk, dv against fp32 autograd (rel. L2),
and the kernel that ran; a first look before the full GPU tests (a hang shows here in seconds)."""
import sys

import torch

import flashtune
from flashtune.measure.reference import attention_reference, rel_l2
from flashtune.runtime import ops

ops.use_profile(sys.argv[1] if len(sys.argv) > 1 else "h200")
for hdim in (64, 128):
    for causal in (False, True):
        for (sq, sk) in ((300, 200), (1024, 1024)):
            torch.manual_seed(hdim + sq)
            q, k, v = (torch.randn(2, s, h, hdim, device="cuda", dtype=torch.bfloat16)
                       for s, h in ((sq, 8), (sk, 2), (sk, 2)))
            dout = torch.randn(2, sq, 8, hdim, device="cuda", dtype=torch.bfloat16)
            ours = [t.clone().requires_grad_() for t in (q, k, v)]
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                flashtune.flash_attn_func(*ours, causal=causal).backward(dout)
                torch.cuda.synchronize()
            ref = [t.float().requires_grad_() for t in (q, k, v)]
            attention_reference(*ref, causal)[0].backward(dout.float())
            errs = [rel_l2(a.grad.float(), b.grad) for a, b in zip(ours, ref)]
            names = sorted({e.key for e in prof.key_averages() if "flashtune_bwd" in e.key})
            print(f"h{hdim} causal={causal} {sq}x{sk}: dq {errs[0]:.2e} dk {errs[1]:.2e} dv {errs[2]:.2e} {names}",
                  flush=True)
