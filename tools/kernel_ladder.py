"""A ladder of attention calls from the simplest up, each in its own process under a time limit,
for a kernel family's first runs on a GPU: a hang costs one rung, not the visit, and a wrong
result prints where it is wrong (which 16-row groups, which 8-column groups of the head dim).

Two probes split the kernel in halves: `V=I` makes the output the softmax matrix P itself
(the S = Q K^T and softmax half), `onehot` makes P a permutation so the output is V's rows
(the P V half).

Run: python3 tools/kernel_ladder.py PROFILE   (a name or a YAML path)
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

# (name, batch, seqlen_q, seqlen_k, heads_q, heads_kv, hdim, causal, probe, dtype, varlen)
RUNGS = [
    ("d64 one block", 1, 64, 64, 1, 1, 64, False, "random", "bf16", False),
    ("d64 S path (V=I)", 1, 64, 64, 1, 1, 64, False, "V=I", "bf16", False),
    ("d64 PV path (onehot)", 1, 64, 64, 1, 1, 64, False, "onehot", "bf16", False),
    ("d64 2 m-blocks", 1, 384, 64, 1, 1, 64, False, "random", "bf16", False),
    ("d64 ring 5 n-blocks", 1, 192, 960, 1, 1, 64, False, "random", "bf16", False),
    ("d64 tails", 1, 77, 130, 1, 1, 64, False, "random", "bf16", False),
    ("d128 one block", 1, 128, 176, 1, 1, 128, False, "random", "bf16", False),
    ("d128 S path (V=I)", 1, 128, 128, 1, 1, 128, False, "V=I", "bf16", False),
    ("d128 PV path (onehot)", 1, 128, 128, 1, 1, 128, False, "onehot", "bf16", False),
    ("d128 long", 2, 1000, 1500, 4, 4, 128, False, "random", "bf16", False),
    ("d256 one block", 1, 128, 80, 1, 1, 256, False, "random", "bf16", False),
    ("d256 S path (V=I)", 1, 128, 256, 1, 1, 256, False, "V=I", "bf16", False),
    ("d256 long", 2, 700, 900, 2, 2, 256, False, "random", "bf16", False),
    ("d64 causal", 1, 500, 700, 2, 2, 64, True, "random", "bf16", False),
    ("d128 causal GQA fp16", 2, 1000, 1000, 8, 2, 128, True, "random", "fp16", False),
    ("d256 causal", 1, 300, 300, 2, 1, 256, True, "random", "bf16", False),
    ("d128 varlen causal", 3, 300, 300, 4, 2, 128, True, "random", "bf16", True),
    ("d128 4k", 1, 4096, 4096, 16, 16, 128, False, "random", "bf16", False),
    # More tiles than SMs: a persistent grid's CTAs loop (causal and varlen: from the counter).
    ("d128 causal 512 tiles", 4, 2048, 2048, 8, 8, 128, True, "random", "bf16", False),
    ("d64 varlen causal 768 tiles", 3, 3000, 3000, 16, 4, 64, True, "random", "bf16", True),
    ("d256 causal fp16 tiles", 2, 1500, 1800, 16, 16, 256, True, "random", "fp16", False),
]


def _inputs(torch, b, sq, sk, hq, hkv, d, probe, dtype):
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype)
    v = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype)
    if probe == "V=I":  # out[i, j] = P[i, j]: the S and softmax half alone
        v.zero_()
        for j in range(min(sk, d)):
            v[:, j, :, j] = 1
    elif probe == "onehot":  # P is a permutation: out[i] = V[(i * 5) % sk], the P V half alone
        q.zero_()
        k.zero_()
        for i in range(sq):
            q[:, i, :, (i * 5) % sk % d] = 16
        for j in range(sk):
            k[:, j, :, j % d] = 16
    return q, k, v


def run_rung(index: int) -> dict:
    import torch

    import flashtune
    from flashtune.measure.reference import attention_reference, rel_l2

    name, b, sq, sk, hq, hkv, d, causal, probe, dt, varlen = RUNGS[index]
    dtype = torch.bfloat16 if dt == "bf16" else torch.float16
    torch.manual_seed(index)
    q, k, v = _inputs(torch, b, sq, sk, hq, hkv, d, probe, dtype)
    if varlen:
        lens_q = [sq, sq // 3, 1][:b]
        lens_k = [sk, sk // 2 + 5, 7][:b]
        cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device="cuda")
        cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32, device="cuda")
        qv = torch.cat([q[i, : lens_q[i]] for i in range(b)])
        kv = torch.cat([k[i, : lens_k[i]] for i in range(b)])
        vv = torch.cat([v[i, : lens_k[i]] for i in range(b)])
        out = flashtune.flash_attn_varlen_func(qv, kv, vv, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal)
        torch.cuda.synchronize()
        errs = []
        for i in range(b):
            ref, _ = attention_reference(q[i : i + 1, : lens_q[i]], k[i : i + 1, : lens_k[i]], v[i : i + 1, : lens_k[i]],
                                         causal, d ** -0.5)
            got = out[int(cu_q[i]) : int(cu_q[i + 1])][None]
            errs.append(rel_l2(got, ref) if lens_q[i] else 0.0)
        return {"rel_l2": max(errs), "nan": 0.0, "note": f"per sequence {['%.1e' % e for e in errs]}"}
    out, lse = flashtune.flash_attn_func(q, k, v, causal=causal, return_lse=True)
    torch.cuda.synchronize()
    ref, ref_lse = attention_reference(q, k, v, causal, d ** -0.5)
    err = (out.float() - ref).abs()
    rows = err.amax(dim=(0, 2, 3))  # per query row
    cols = err.amax(dim=(0, 1, 2))  # per head-dim column
    bad_rows = [i for i in range(0, sq, 16) if rows[i : i + 16].max() > 0.05]
    bad_cols = [c for c in range(0, d, 8) if cols[c : c + 8].max() > 0.05]
    finite = torch.isfinite(ref_lse)
    lse_err = (lse.float() - ref_lse).abs()[finite].max().item() if finite.any() else 0.0
    return {"rel_l2": rel_l2(out, ref), "nan": out.isnan().float().mean().item(), "lse_max_err": lse_err,
            "bad_row16": bad_rows[:12], "bad_col8": bad_cols[:12],
            "sample": [[round(x, 3) for x in out[0, r, 0, :6].float().tolist()] for r in (0, 1, 8)],
            "sample_ref": [[round(x, 3) for x in ref[0, r, 0, :6].tolist()] for r in (0, 1, 8)]}


def main() -> int:
    if sys.argv[1] == "--rung":
        from flashtune.runtime import ops

        ops.use_profile(sys.argv[3])
        print(json.dumps(run_rung(int(sys.argv[2]))))
        return 0
    profile, failures = sys.argv[1], 0
    for i, rung in enumerate(RUNGS):
        start = time.time()
        try:
            proc = subprocess.run([sys.executable, __file__, "--rung", str(i), profile], capture_output=True,
                                  text=True, timeout=60)
            last = (proc.stdout.strip().splitlines() or [""])[-1]
            result = json.loads(last) if proc.returncode == 0 else {"error": proc.stderr.strip()[-400:]}
        except subprocess.TimeoutExpired:
            result = {"error": "timed out after 60 s (a hang?)"}
        ok = "error" not in result and result["rel_l2"] < 2e-2 and result.get("nan", 0) == 0
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {rung[0]:<24} {time.time() - start:5.1f}s {json.dumps(result)}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
