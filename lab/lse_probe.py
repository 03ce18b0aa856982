"""Device probe (issue 30): outputs a call can leave unwritten, and LSE that differs between two
identical calls. Every output poisoned (NaN) before each call; per case, which rows stay NaN or
differ between the calls, whether those rows see a key, and the values found there.
Usage: PYTHONPATH=. python3 lab/lse_probe.py PROFILE..."""
import os
import sys

import torch

import flashtune.runtime.ops as ops
from flashtune import flash_attn_func, flash_attn_varlen_func

CASES = [  # (seqlen_q, seqlen_k, batch, heads)
    (239, 1, 60, 4), (799, 3, 60, 4), (1024, 128, 60, 4), (4097, 1000, 2, 4), (128, 17, 3, 5),
    (3000, 200, 8, 16), (700, 0, 4, 4)]


def no_key_rows(sq, sk, causal):
    rows = torch.arange(sq, device="cuda")
    return (rows + sk - sq < 0) if causal else torch.full((sq,), sk == 0, device="cuda")


def same(a, b):
    return torch.equal(torch.nan_to_num(a, nan=7.0), torch.nan_to_num(b, nan=7.0)) and torch.equal(a.isnan(), b.isnan())


def probe(profile):
    ops.use_profile(profile)
    ops.poison_outputs = True
    bad = 0
    for dtype in [getattr(torch, d) for d in os.environ.get("PROBE_DTYPES", "float16,bfloat16").split(",")]:
        for hdim in [int(h) for h in os.environ.get("PROBE_HDIMS", "64,128,256").split(",")]:
            for causal in (True, False):
                for sq, sk, b, h in CASES:
                    q = torch.randn(b, sq, h, hdim, device="cuda", dtype=dtype)
                    k, v = (torch.randn(b, sk, h, hdim, device="cuda", dtype=dtype) for _ in range(2))
                    try:
                        o1, l1 = flash_attn_func(q, k, v, causal=causal, return_lse=True)
                        o2, l2 = flash_attn_func(q, k, v, causal=causal, return_lse=True)
                        torch.cuda.synchronize()
                    except Exception as e:  # noqa: BLE001
                        print(f"{profile} {dtype} h{hdim} c{int(causal)} {sq}/{sk}: ERROR {str(e).splitlines()[0][:150]}")
                        bad += 1
                        continue
                    nk = no_key_rows(sq, sk, causal)
                    msgs = []
                    for name, x in (("o1", o1), ("o2", o2), ("l1", l1), ("l2", l2)):
                        n = int(x.isnan().sum())
                        if n:
                            msgs.append(f"{name} NaN {n}")
                    if not same(o1, o2):
                        msgs.append("O differs")
                    if not same(l1, l2):
                        diff = ~((l1 == l2) | (l1.isnan() & l2.isnan()))  # (b, h, sq)
                        rows = diff.any(0).any(0)
                        msgs.append(f"LSE differs in {int(diff.sum())} entries, rows {int(rows.sum())} "
                                    f"(no-key rows among them {int((rows & nk).sum())}); e.g. "
                                    f"{l1[diff][:3].tolist()} vs {l2[diff][:3].tolist()}")
                    if nk.any():
                        vals = torch.unique(l1[..., nk]).tolist()[:4]
                        omax = float(o1.transpose(1, 2)[..., nk, :].abs().nan_to_num(nan=9.0).max())
                        msgs.append(f"no-key LSE values {vals} |O| max {omax}")
                    status = "BAD " if any("NaN" in m or "differs" in m for m in msgs) else "ok  "
                    bad += status == "BAD "
                    print(f"{status}{profile} {str(dtype)[6:]} h{hdim} c{int(causal)} {sq}/{sk} b{b}h{h}: {'; '.join(msgs)}")
                # varlen: zero-length sequences on either side
                lens_q, lens_k = [5, 0, 1, 300, 129, 64, 200], [7, 3, 1, 300, 0, 1000, 0]
                cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
                cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
                q = torch.randn(sum(lens_q), 6, hdim, device="cuda", dtype=dtype)
                k, v = (torch.randn(sum(lens_k), 2, hdim, device="cuda", dtype=dtype) for _ in range(2))
                try:
                    o1, l1 = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True, return_lse=True)
                    o2, l2 = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True, return_lse=True)
                    torch.cuda.synchronize()
                    msgs = [f"{n} NaN {int(x.isnan().sum())}" for n, x in (("o", o1), ("lse", l1)) if x.isnan().any()]
                    if not (same(o1, o2) and same(l1, l2)):
                        msgs.append("differs")
                    print(f"{'BAD ' if msgs else 'ok  '}{profile} {str(dtype)[6:]} h{hdim} varlen: {'; '.join(msgs)} "
                          f"lse of k-empty seqs {torch.unique(l1[:, 306:435]).tolist()[:3]}")
                    bad += bool(msgs)
                except Exception as e:  # noqa: BLE001
                    print(f"{profile} {dtype} h{hdim} varlen: ERROR {str(e).splitlines()[0][:150]}")
    print(f"== {profile}: {bad} bad cases")


for name in sys.argv[1:]:
    probe(name)
