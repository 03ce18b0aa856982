"""A short GPU smoke of the decode paths (for a visit with little device time): builds the binding and
the few decode kernels it needs in parallel, then runs a handful of tests/test_kvcache_gpu.py's
cases and flash_attn_func's decode dispatch against fp32. Usage: PYTHONPATH=. python3 lab/decode_smoke.py"""
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch

sys.path.insert(0, "tests")
import test_kvcache_gpu as t  # noqa: E402

from flashtune.kernels.build import build_binding, build_specs  # noqa: E402
from flashtune.measure.reference import attention_reference, rel_l2  # noqa: E402
from flashtune.measure.timing import kernel_names  # noqa: E402
from flashtune.runtime import ops  # noqa: E402
from flashtune.runtime.decode import decode_spec  # noqa: E402
from flashtune.runtime.selection import active_profile  # noqa: E402

start = time.time()
profile = active_profile(torch.device("cuda"))
bf16 = torch.bfloat16
specs = {decode_spec(profile, bf16, 128, c, sq, r, p) for c, sq, r, p in
         [(False, 1, 4, None), (True, 4, 4, None), (True, 4, 4, 16), (True, 9, 4, 16), (False, 1, 4, 16),
          (False, 1, 4, 64), (True, 1, 4, 16)]}
with ThreadPoolExecutor(2) as pool:
    binding = pool.submit(build_binding)
    _, failures = build_specs(list(specs), jobs=15)
    binding.result()
assert not failures, failures
print(f"built {len(specs)} decode kernels and the binding in {time.time() - start:.0f} s", flush=True)
ops.poison_outputs = True
cases = [("one query, splits 0", lambda: t.test_decode_one_query_gqa_mqa_and_splits(128, 8, 0)),
         ("one query, splits 3", lambda: t.test_decode_one_query_gqa_mqa_and_splits(128, 8, 3)),
         ("causal q4 splits 3", lambda: t.test_causal_query_lengths(4, 3)),
         ("paged 16 causal q4", lambda: t.test_paged_cache(16, True, 4, 0)),
         ("paged 64 q1", lambda: t.test_paged_cache(64, False, 1, 3)),
         ("vLLM varlen paged", lambda: t.test_vllms_paged_varlen_call(16, "seqused_k")),
         ("vLLM varlen cu_seqlens_k", lambda: t.test_vllms_paged_varlen_call(16, "cu_seqlens_k")),
         ("batch idx + leftpad", t.test_cache_batch_idx_and_leftpad),
         ("append rotary halves causal paged", lambda: t.test_append_with_and_without_rotary(True, "halves", True)),
         ("bit-identical, splits agree", t.test_two_identical_calls_are_bit_identical_and_splits_agree),
         ("cuda graph replay", t.test_cuda_graph_replay_follows_new_seqlens_and_block_table)]
for name, case in cases:
    try:
        case()
        print(f"ok    {name}", flush=True)
    except Exception as e:  # report and go on
        print(f"FAIL  {name}: {type(e).__name__}: {str(e)[:200]}", flush=True)
q = torch.randn(2, 1, 32, 128, device="cuda", dtype=bf16)
k, v = (torch.randn(2, 4097, 8, 128, device="cuda", dtype=bf16) for _ in range(2))
out, lse = ops.flash_attn_func(q, k, v, return_lse=True)
ref, ref_lse = attention_reference(q, k, v)
names = kernel_names(lambda: ops.flash_attn_func(q, k, v))
print(f"flash_attn_func 1/4097: rel err {rel_l2(out, ref):.1e}, lse err {(lse - ref_lse).abs().max().item():.1e}, "
      f"kernels {names}")
print(f"done in {time.time() - start:.0f} s")
