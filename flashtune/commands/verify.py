"""`flashtune verify`: prove the kernel that runs is the expected one, and that it is right.

Three checks, each a list of rows with `ok`:
* correctness: a matrix of shapes against the fp32 reference, the bar set by what SDPA
  achieves on the same inputs (flashtune.measure.tolerance), outputs poisoned before each launch;
  the backward's rows judge dq, dk and dv by FlashAttention's rule (flashtune.measure.gradients);
* identity: under torch.profiler, the exact kernel name of the spec chosen for the call
  launched, and no other attention kernel (SDPA flash/cuDNN/efficient, a math GEMM) ran;
* SASS: cuobjdump shows code for the target arch, the family's instructions (HMMA, LDSM,
  LDGSTS for sm80; HGMMA and TMA for sm90; an FP8 kernel's e4m3 MMA, QGMMA in place of HGMMA where
  both GEMMs are e4m3) and no local-memory traffic (LDL/STL) where ptxas reported no spills.

`--sdpa` instead reports which backend PyTorch's own scaled_dot_product_attention picks
for each shape asked, and why it refuses the others. How the reports are shown is at the end.
"""
from __future__ import annotations

import itertools
import math
import re
import subprocess
import warnings
from dataclasses import asdict, dataclass, field, replace

from rich.console import Console
from rich.table import Table

from flashtune.commands.common import EXIT_FAILED, EXIT_OK
from flashtune.kernels.bwd_spec import BWD_HEAD_DIMS, bwd_spec_for_profile
from flashtune.kernels.decode_spec import DecodeSpec
from flashtune.kernels.tiles import prefill_head_dims
from flashtune.measure.problem import Problem, make_inputs

# Kernel names that mean some attention implementation ran (besides the expected one).
ATTENTION_KERNEL_RE = re.compile(
    r"flash|fmha|attention|attn|cudnn|sdpa|softmax|gemm|gemv|bmm|xmma|cutlass", re.IGNORECASE)

# Instructions each family's kernels must contain (cuobjdump -sass mnemonics, by prefix); the
# Hopper backward adds dQ by TMA reduce-adds (UTMAREDG).
FAMILY_SASS = {"sm80": ("HMMA", "LDSM", "LDGSTS"), "sm90": ("HGMMA", "UTMALDG"), "decode": ("HMMA", "LDSM", "LDGSTS"),
               "backward": ("HMMA", "LDSM", "LDGSTS"), "backward-wgmma": ("HGMMA", "UTMALDG", "UTMAREDG")}
# ... and what an FP8 Q/K kernel adds: wgmma on e4m3 (QGMMA), or mma.sync m16n8k32 e4m3 (QMMA on
# sm_89/sm_120). Plain sm_90 has no native FP8 mma.sync: ptxas unpacks e4m3 to f16 for HMMA
# (F2FP ... E4M3.UNPACK_B), correct but slow; Hopper's fast FP8 path is the sm90 family.
FP8_SASS = {"sm80": "QMMA.16832.F32.E4M3", "sm90": "QGMMA"}
FP8_SASS_PLAIN_SM90 = "F2FP.F16.E4M3.UNPACK_B"
# FP8 Q/K cases check the kernel against the fp32 reference of its own (dequantised) inputs;
# the end-to-end error against the 16-bit inputs, e4m3's 3-bit-mantissa rounding included
# (3-4e-2 on random-normal inputs on the H200), is reported beside it.
FP8_KERNEL_MAX_REL_ERR = 1e-2
# ... and the end-to-end bar, which also catches a broken quantisation (both sides of the kernel
# check go through it): e4m3 rounding alone gives 3.1-4.2e-2 on random-normal inputs.
FP8_END_TO_END_MAX_REL_ERR = 5e-2
# All-FP8 cases (P and V in e4m3 too) check the kernel against the fp32 reference of its dequantised
# q, k, v with P's rounding to e4m3 allowed for (fp8_floor.P_ROUNDING_FACTOR, as the tests and the
# tuner do); end to end, P's rounding adds about 1.4x to the Q/K kernel's error (issue 36 allows 2x).
FP8_ALL_END_TO_END_MAX_REL_ERR = 2 * FP8_END_TO_END_MAX_REL_ERR
V_TRANSPOSE_KERNEL = "flashtune::sm90::v_transpose_kernel"  # an all-FP8 call's first pass: V laid out as V^T
SDPA_BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")


@dataclass
class Check:
    """One row of the report: a check of one case (correctness, identity) or one kernel (sass);
    ok None: skipped, with the reason in detail."""
    check: str  # "correctness", "identity" or "sass"
    kernel: str
    ok: bool | None
    detail: str
    case: str = ""
    rel_err: float | None = None  # correctness: against the fp32 reference
    tolerance: float | None = None  # ... and its bar
    end_to_end_rel_err: float | None = None  # FP8 cases: against the 16-bit inputs' reference
    observed: list[str] | None = None  # identity: every kernel the profiler saw


@dataclass
class VerifyReport:
    profile: str
    arch: str
    family: str
    rows: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return sum(r.ok is False for r in self.rows)

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.ok else EXIT_FAILED

    def to_json(self) -> dict:
        return {"profile": self.profile, "arch": self.arch, "family": self.family, "ok": self.ok,
                "failed": self.failed, "exit_code": self.exit_code, "rows": [asdict(r) for r in self.rows]}


@dataclass
class SdpaReport:
    """Which backend PyTorch's SDPA picks for one shape, and why each one can or cannot run it."""
    shape: dict
    default_kernels: list[str]
    picked: str
    backends: list[dict]  # {"backend", "usable", "why"}

    def to_json(self) -> dict:
        return asdict(self)


def _problem(name: str, *fields, **keywords) -> Problem:
    return Problem(*fields, name=name, **keywords)


def correctness_cases(profile) -> list[Problem]:
    """The matrix: every dtype and head dim of the profile, causal and not, odd and GQA shapes."""
    cases = []
    for dtype in profile.dtypes:
        for hdim in profile.head_dims:
            for causal in (False, True):
                c = "causal" if causal else "full"
                cases.append(_problem(f"{dtype} d{hdim} {c} 512", dtype, hdim, causal, 512, 512))
                cases.append(_problem(f"{dtype} d{hdim} {c} 17/1000", dtype, hdim, causal, 17, 1000))
                cases.append(_problem(f"{dtype} d{hdim} {c} 1000/17", dtype, hdim, causal, 1000, 17))
        hdim = profile.head_dims[0]
        cases.append(_problem(f"{dtype} d{hdim} GQA 8:2 causal 333/555", dtype, hdim, True, 333, 555,
                          heads=8, heads_kv=2))
        cases.append(_problem(f"{dtype} d{hdim} MQA 8:1 300", dtype, hdim, False, 300, 300, heads=8, heads_kv=1))
        cases.append(_problem(f"{dtype} d{hdim} varlen causal", dtype, hdim, True, 0, 0, batch=4, varlen=True))
        for hdim in profile.head_dims:  # the decode kernels: one query, and four (causal), GQA 32:8
            cases.append(_problem(f"decode {dtype} d{hdim} GQA 32:8 1/5000", dtype, hdim, False, 1, 5000,
                                  heads=32, heads_kv=8))
            cases.append(_problem(f"decode {dtype} d{hdim} GQA 32:8 causal 4/777", dtype, hdim, True, 4, 777,
                                  heads=32, heads_kv=8))
        hdim = 128 if 128 in profile.head_dims else profile.head_dims[0]
        for page, causal, sq in ((16, True, 4), (64, False, 1), (1, False, 1)):  # flash_attn_with_kvcache, paged
            c = "causal " if causal else ""
            cases.append(_problem(f"decode {dtype} d{hdim} pages of {page} {c}{sq}/777", dtype, hdim, causal, sq,
                                  777, heads=32, heads_kv=8, page_size=page))
        # 128 packed rows a KV head (MQA, 4 tokens): an sm90 profile's KV-cache kernels (wgmma), else
        # the decode kernels; contiguous through flash_attn_func, and on pages of whole key blocks.
        for hdim in profile.head_dims:
            cases.append(_problem(f"decode {dtype} d{hdim} MQA 32:1 causal 4/3000", dtype, hdim, True, 4, 3000,
                                  heads=32, heads_kv=1))
        hdim = 128 if 128 in profile.head_dims else profile.head_dims[0]
        cases.append(_problem(f"decode {dtype} d{hdim} MQA 32:1 pages of 256 causal 4/777", dtype, hdim, True, 4,
                              777, heads=32, heads_kv=1, page_size=256))
        # MQA with one token: a short call (5 MB of K/V) packs its 32 rows in two 16-row blocks, a long
        # one (67 MB: over 6 us at any of these GPUs' memory peaks) in one 32-row block
        for keys in (5000, 65536):
            cases.append(_problem(f"decode {dtype} d{hdim} MQA 32:1 1/{keys}", dtype, hdim, False, 1, keys,
                                  heads=32, heads_kv=1))
        if 256 in profile.head_dims:  # ... at hdim 256 as two row groups of 16 sharing each ring (134 MB)
            cases.append(_problem(f"decode {dtype} d256 MQA 32:1 1/65536", dtype, 256, False, 1, 65536,
                                  heads=32, heads_kv=1))
        for hdim in (h for h in profile.head_dims if h in BWD_HEAD_DIMS):  # gradients, GQA 8:2, odd lengths
            for causal in (False, True):
                c = "causal" if causal else "full"
                cases.append(_problem(f"backward {dtype} d{hdim} GQA 8:2 {c} 200/333", dtype, hdim, causal, 200, 333,
                                      heads=8, heads_kv=2, backward=True))
    if profile.fp8_kv:  # the decode kernels' FP8 twins on an e4m3 cache, judged against the format's floor
        dtype = profile.dtypes[-1]
        for hdim in profile.head_dims:
            cases.append(_problem(f"fp8kv decode {dtype} d{hdim} GQA 32:8 1/5000", dtype, hdim, False, 1, 5000,
                                  heads=32, heads_kv=8, kv_fp8=True))
        hdim = 128 if 128 in profile.head_dims else profile.head_dims[0]
        cases.append(_problem(f"fp8kv decode {dtype} d{hdim} pages of 64 causal 4/777", dtype, hdim, True, 4, 777,
                              heads=32, heads_kv=8, page_size=64, kv_fp8=True))
    if profile.fp8_qk:  # the FP8 Q/K kernels, on 16-bit inputs quantised by the op
        dtype = profile.dtypes[-1]
        for hdim in prefill_head_dims(profile.head_dims, fp8=True):
            for causal in (False, True):
                c = "causal" if causal else "full"
                cases.append(_problem(f"fp8qk {dtype} d{hdim} {c} 512", dtype, hdim, causal, 512, 512, fp8=True))
                cases.append(_problem(f"fp8qk {dtype} d{hdim} {c} 17/1000", dtype, hdim, causal, 17, 1000, fp8=True))
        hdim = profile.head_dims[0]
        cases.append(_problem(f"fp8qk {dtype} d{hdim} GQA 8:2 causal 333/555", dtype, hdim, True, 333, 555,
                          heads=8, heads_kv=2, fp8=True))
    if profile.fp8_pv:  # the all-FP8 kernels (sm90), on 16-bit inputs quantised by the op, q, k and v
        dtype = profile.dtypes[-1]
        for hdim in prefill_head_dims(profile.head_dims, fp8=True):
            for causal in (False, True):
                c = "causal" if causal else "full"
                cases.append(_problem(f"fp8all {dtype} d{hdim} {c} 17/1000", dtype, hdim, causal, 17, 1000,
                                      fp8=True, fp8_pv=True))
        hdim = profile.head_dims[0]
        cases.append(_problem(f"fp8all {dtype} d{hdim} GQA 8:2 causal 333/555", dtype, hdim, True, 333, 555,
                              heads=8, heads_kv=2, fp8=True, fp8_pv=True))
    return cases


# ---------------------------------------------------------------------------- pure helpers

def unexpected_attention_kernels(names: list[str], expected: str, companions: tuple[str, ...] = ()) -> list[str]:
    """Kernels in `names` that look like attention work other than the expected kernel and its
    companions (a decode kernel's combine kernel)."""
    return [n for n in names if n != expected and n not in companions and ATTENTION_KERNEL_RE.search(n)]


def own_companions(spec, names: list[str]) -> tuple[str, ...]:
    """The kernels a call launches beside its spec's own: a decode call's combine kernel, an all-FP8
    call's V^T pass (runtime/ops.py's run_spec)."""
    if isinstance(spec, DecodeSpec):
        return (spec.combine_name,)
    if getattr(spec, "fp8_pv", False):
        return tuple(n for n in names if V_TRANSPOSE_KERNEL in n)
    return ()


def combine_problem(names: list[str], combine_name: str, merge: str | None) -> str | None:
    """A decode call's combine kernel must launch exactly when its splits merged through it (`merge`:
    run_decode's last launch, "none", "cluster" or "combine kernel"; None: not a decode call). What
    went wrong, or None."""
    if merge is None:
        return None
    ran = combine_name in names
    if merge == "combine kernel" and not ran:
        return f"the splits were to merge in {combine_name}, which did not launch"
    if merge != "combine kernel" and ran:
        return f"{combine_name} launched, though the splits merged by {merge}"
    return None


def parse_sass(text: str, kernel: str) -> dict:
    """From `cuobjdump -sass` output: the arch of the kernel's code and its mnemonics (with
    their modifiers, e.g. HMMA.16816.F32.BF16)."""
    arch, current, in_kernel, mnemonics = None, None, False, set()
    for line in text.splitlines():
        m = re.search(r"code for (sm_\w+)", line)
        if m:
            current = m.group(1)
        m = re.search(r"Function : (\S+)", line)
        if m:
            in_kernel = m.group(1) == kernel
            if in_kernel:
                arch = current
            continue
        if in_kernel:
            m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
            if m:
                mnemonics.add(m.group(1))
    return {"found": arch is not None, "arch": arch, "mnemonics": mnemonics}


def run_cuobjdump(cuobjdump: str, args: list[str]) -> subprocess.CompletedProcess:
    """cuobjdump -sass needs nvdisasm; the pip wheels put it beside cuobjdump, off PATH."""
    import os

    env = {**os.environ, "PATH": os.path.dirname(cuobjdump) + os.pathsep + os.environ.get("PATH", "")}
    return subprocess.run([cuobjdump, *args], capture_output=True, text=True, env=env)


def wanted_sass(spec) -> tuple[str, ...]:
    """The instructions a kernel must contain: its family's, and an FP8 kernel's e4m3 MMA. An all-FP8
    kernel runs both GEMMs on e4m3, so it has QGMMA and no HGMMA at all."""
    wanted = FAMILY_SASS[spec.family]
    if getattr(spec, "fp8_pv", False):
        return tuple(op for op in wanted if op != "HGMMA") + (FP8_SASS[spec.family],)
    if spec.fp8:
        wanted += (FP8_SASS_PLAIN_SM90 if spec.family == "sm80" and spec.arch == "sm_90" else FP8_SASS[spec.family],)
    return wanted


def sass_row(spec, library: str, spilled: bool, cuobjdump: str | None) -> Check:
    """One SASS check: arch, the family's instructions, and no LDL/STL unless ptxas spilled."""
    if cuobjdump is None:
        return Check("sass", spec.name, None, "skipped: cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    proc = run_cuobjdump(cuobjdump, ["-sass", "-fun", spec.name, library])
    if proc.returncode != 0:
        return Check("sass", spec.name, None, f"skipped: cuobjdump failed: {proc.stderr.strip()[:200]}")
    sass = parse_sass(proc.stdout, spec.name)
    want_arch = spec.arch.rstrip("a")
    problems = []
    if not sass["found"]:
        problems.append("kernel not in the library")
    elif (sass["arch"] or "").rstrip("a") != want_arch:
        problems.append(f"code for {sass['arch']}, expected {spec.arch}")
    wanted = wanted_sass(spec)
    missing = [op for op in wanted if not any(m.startswith(op) for m in sass["mnemonics"])]
    if missing:
        problems.append(f"missing {', '.join(missing)}")
    local = sorted({m.split(".")[0] for m in sass["mnemonics"]} & {"LDL", "STL"})
    if local and not spilled:
        problems.append(f"{'/'.join(local)} present although ptxas reported no spills")
    found = sorted({op for op in wanted + ("LDL", "STL") if any(m.startswith(op) for m in sass["mnemonics"])})
    detail = f"{sass['arch']}: {', '.join(found)}"
    return Check("sass", spec.name, not problems, "; ".join(problems) if problems else detail)


# ---------------------------------------------------------------------------- GPU checks

# A varlen case's sequences (at most four): lengths of 0, 1, odd and long, queries and keys.
VARLEN_LENS_Q, VARLEN_LENS_K = (7, 0, 300, 1), (9, 4, 300, 600)


def case_spec(case: Problem, profile, device_index: int):
    """The kernel a case's call launches (what its identity row expects), from its shape alone, as the
    runtime chooses it (runtime/selection.py's kernel_for, runtime/decode.py's decode_spec for a
    paged or e4m3 cache); a backward case's backward kernel."""
    import torch

    from flashtune.runtime.decode import decode_spec
    from flashtune.runtime.selection import kernel_for

    if case.backward:
        return bwd_spec_for_profile(profile, case.dtype, case.hdim, case.causal)
    sq, sk = ((max(VARLEN_LENS_Q[:case.batch]), max(VARLEN_LENS_K[:case.batch])) if case.varlen else
              (case.seqlen_q, case.seqlen_k))
    # The key rows the call reads, as the runtime counts them (a paged cache: its whole pages).
    keys = -(-sk // case.page_size) * case.page_size if case.page_size else sk
    key_rows = 0 if case.varlen else case.batch * case.heads_kv * keys
    if case.page_size or case.kv_fp8:
        return decode_spec(profile, getattr(torch, case.dtype), case.hdim, case.causal, sq,
                           case.heads // case.heads_kv, case.page_size or None, kv_fp8=case.kv_fp8,
                           key_rows=key_rows, device_index=device_index)
    return kernel_for(profile, case.dtype, case.hdim, case.causal, sq, sk, case.heads // case.heads_kv,
                      fp8=case.fp8, varlen=case.varlen, key_rows=key_rows, device_index=device_index,
                      fp8_pv=case.fp8_pv)


def verify_kernels(profile, device_index: int) -> list:
    """Every kernel the case matrix launches, once each: a backward case's forward too."""
    specs = {}
    for case in correctness_cases(profile):
        specs[case_spec(case, profile, device_index)] = None
        if case.backward:
            specs[case_spec(replace(case, backward=False), profile, device_index)] = None
    return list(specs)


def build_kernels(specs: list, jobs: int | None = None, on_done=None) -> list:
    """Compile `specs` side by side (jobs: parallel compiles, default one per core and 2 GB) before
    the checks run, which would otherwise build each case's kernel as it first launches, one at a
    time: under h200, three tries of 270-330 s on an H100 machine finished no verify. Returns the
    failures as (spec, error); a case that needs one of those kernels raises its error when it runs."""
    from flashtune.kernels.build import build_specs

    _, failures = build_specs(specs, jobs=jobs, on_done=on_done)
    return failures


def _inputs(case: Problem, seed: int):
    """q, k, v for the case, and for a varlen case its (cu_seqlens_q, cu_seqlens_k, max_q, max_k):
    sequences of 0, 1, odd and long lengths packed together; for a paged case its paged K and V
    (the same keys, in shuffled pages), block table and key counts."""
    import torch

    if case.kv_fp8:  # the cache in e4m3, from the 16-bit keys and values the reference sees
        from flashtune.runtime.fp8 import kv_descales, quantise_kv

        q, k, v = make_inputs(case, seed)
        k_descale, v_descale = kv_descales(k, v)
        k8, v8 = quantise_kv(k, k_descale), quantise_kv(v, v_descale)
        cache = _paged(k8, v8, case.page_size, seed) if case.page_size else {
            "k": k8, "v": v8, "block_table": None, "lens": None}
        return q, k, v, {**cache, "k8": k8, "v8": v8, "k_descale": k_descale, "v_descale": v_descale}
    if case.page_size:
        q, k, v = make_inputs(case, seed)
        return q, k, v, _paged(k, v, case.page_size, seed)
    if not case.varlen:
        return (*make_inputs(case, seed), None)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dtype = getattr(torch, case.dtype)
    lens_q, lens_k = VARLEN_LENS_Q[:case.batch], VARLEN_LENS_K[:case.batch]
    cu_q = torch.tensor([0, *itertools.accumulate(lens_q)], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, *itertools.accumulate(lens_k)], dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lens_q), case.heads, case.hdim, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(sum(lens_k), case.heads_kv, case.hdim, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(sum(lens_k), case.heads_kv, case.hdim, device="cuda", dtype=dtype, generator=gen)
    return q, k, v, (cu_q, cu_k, max(lens_q), max(lens_k))


def _paged(k, v, page_size: int, seed: int) -> dict:
    """k and v (batch, seqlen, heads_kv, d) as a paged cache: each sequence's keys in pages of
    `page_size` (the last one part-filled), the pages shuffled, a block table to them."""
    import torch

    batch, seqlen = k.shape[:2]
    per_seq = -(-seqlen // page_size)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    order = torch.randperm(batch * per_seq, device="cuda", generator=gen)
    paged = []
    for t in (k, v):
        bytes_ = t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t  # e4m3 moved as its bytes
        padded = torch.zeros(batch, per_seq * page_size, *t.shape[2:], device=t.device, dtype=bytes_.dtype)
        padded[:, :seqlen] = bytes_
        pages = torch.empty_like(padded).view(batch * per_seq, page_size, *t.shape[2:])
        pages[order] = padded.view(batch * per_seq, page_size, *t.shape[2:])
        paged.append(pages.view(t.dtype))
    lens = torch.full((batch,), seqlen, dtype=torch.int32, device="cuda")
    return {"k": paged[0], "v": paged[1], "block_table": order.view(batch, per_seq).to(torch.int32), "lens": lens}


def _call(q, k, v, case: Problem, varlen_args):
    from flashtune.runtime import kvcache, ops

    if case.page_size or case.kv_fp8:
        c = varlen_args
        return kvcache.flash_attn_with_kvcache(q, c["k"], c["v"], cache_seqlens=c["lens"], block_table=c["block_table"],
                                               causal=case.causal, return_softmax_lse=True,
                                               k_descale=c.get("k_descale"), v_descale=c.get("v_descale"))
    if varlen_args:
        cu_q, cu_k, mq, mk = varlen_args
        return ops.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=case.causal, return_lse=True)
    return ops.flash_attn_func(q, k, v, causal=case.causal, qk_fp8=case.fp8, pv_fp8=case.fp8_pv, return_lse=True)


def dequantised_qk(q, k):
    """The values an FP8 kernel actually multiplies when the op quantises q and k, in fp32."""
    from flashtune.runtime import ops

    q8, k8, q_descale, k_descale = ops.quantise_qk(q, k, k.shape[2])
    ratio = q.shape[2] // k.shape[2]
    return (q8.float() * q_descale.repeat_interleave(ratio, dim=1)[:, None, :, None],
            k8.float() * k_descale[:, None, :, None])


def dequantised_qkv(q, k, v):
    """The values an all-FP8 kernel multiplies when the op quantises q, k and v, in fp32."""
    from flashtune.measure.fp8_floor import dequantised
    from flashtune.runtime.fp8 import quantise_v

    return (*dequantised_qk(q, k), dequantised(*quantise_v(v)))


def all_fp8_reference(q, k, v, causal: bool, scale: float):
    """(fp32 reference output, its LSE, bar) for an all-FP8 kernel on 16-bit q, k, v the op quantised:
    attention on the values it multiplies, within P_ROUNDING_FACTOR x P's own rounding to e4m3 plus the
    FP8 kernels' bar (verify's rows, the tuner's check and tests/test_fp8_all_gpu.py hold it to this)."""
    from flashtune.measure.fp8_floor import P_ROUNDING_FACTOR, p_rounded_attention
    from flashtune.measure.reference import attention_reference, rel_l2

    qd, kd, vd = dequantised_qkv(q, k, v)
    ref, lse = attention_reference(qd, kd, vd, causal, scale)
    return ref, lse, P_ROUNDING_FACTOR * rel_l2(p_rounded_attention(qd, kd, vd, causal, scale), ref) + FP8_KERNEL_MAX_REL_ERR


def check_backward_case(case: Problem, profile, seed: int):
    """(correctness and identity rows, the backward spec): dq, dk and dv of one forward through the
    backward kernel against fp32 autograd, by FlashAttention's rule; the profiler on the backward
    alone sees the spec's kernel and no other attention kernel."""
    import torch

    from flashtune.measure.gradients import gradient_errors, gradients, same_dtype_attention
    from flashtune.measure.reference import attention_reference
    from flashtune.measure.timing import kernel_names
    from flashtune.runtime import ops

    spec = case_spec(case, profile, torch.cuda.current_device())
    q, k, v = make_inputs(case, seed)
    dout = make_inputs(case, seed + 1)[0]

    def ours(q, k, v):
        return ops.flash_attn_func(q, k, v, causal=case.causal)

    ops.poison_outputs = True
    try:
        got = gradients(ours, (q, k, v), dout)
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = ours(*leaves)
        names = kernel_names(lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True))
    finally:
        ops.poison_outputs = False
    ref = gradients(lambda q, k, v: attention_reference(q, k, v, case.causal)[0], [t.float() for t in (q, k, v)],
                    dout.float())
    lowp = gradients(lambda q, k, v: same_dtype_attention(q, k, v, case.causal), (q, k, v), dout)
    errors = gradient_errors(got, ref, lowp)
    worst = max(errors, key=lambda e: e.rel_err / e.bar)
    detail = "; ".join(f"{e.name} {e.rel_err:.2e} {'<=' if e.rel_err <= e.bar else '>'} {e.bar:.2e}"
                       + (f", {e.unwritten} never written" if e.unwritten else "")
                       + ("" if e.max_abs <= e.max_abs_bar else f", max abs {e.max_abs:.2e} > {e.max_abs_bar:.2e}")
                       for e in errors)
    correct = Check("correctness", spec.name, all(e.ok for e in errors), detail, case.name,
                    rel_err=worst.rel_err, tolerance=worst.bar)
    others = unexpected_attention_kernels(names, spec.name, spec.companion_names)
    order = spec.launch_order(case.heads != case.heads_kv)
    launched = [n for n in names if n in order] == order
    identity = Check("identity", spec.name, launched and not others,
                     ("launched: " + ", then ".join(order) if launched else
                      f"expected {order} in that order; saw {names}")
                     + (f"; other attention kernels ran: {others}" if others else ""), case.name, observed=names)
    return [correct, identity], spec


def check_case(case: Problem, profile, expected_kernel: str | None, seed: int):
    """(correctness and identity rows, the spec that served the case)."""
    import torch

    if case.backward:
        return check_backward_case(case, profile, seed)

    from flashtune.runtime import ops
    from flashtune.measure.tolerance import tolerance
    from flashtune.measure.timing import kernel_names
    from flashtune.measure.reference import attention_reference, rel_l2, varlen_reference

    q, k, v, varlen_args = _inputs(case, seed)
    scale = 1.0 / math.sqrt(case.hdim)
    spec = case_spec(case, profile, q.device.index)
    expected = expected_kernel or spec.name

    from flashtune.runtime import decode

    ops.poison_outputs = True
    try:
        out, _ = _call(q, k, v, case, varlen_args)
        torch.cuda.synchronize()
        decode.last_launch = None
        names = kernel_names(lambda: _call(q, k, v, case, varlen_args))
    finally:
        ops.poison_outputs = False
    merge = decode.last_launch.merge if isinstance(spec, DecodeSpec) and decode.last_launch is not None else None
    companions = own_companions(spec, names)
    if case.varlen:
        ref, _ = varlen_reference(q, k, v, varlen_args[0], varlen_args[1], case.causal, scale)
        cq, ck = varlen_args[0].tolist(), varlen_args[1].tolist()
        tol = max(tolerance(q[a:b][None], k[c:d][None], v[c:d][None], case.causal, scale, ref[a:b][None])
                  for a, b, c, d in zip(cq, cq[1:], ck, ck[1:]) if b > a)
    else:
        ref, _ = attention_reference(q, k, v, case.causal, scale)
        tol = tolerance(q, k, v, case.causal, scale, ref)
    end_to_end = None
    if case.kv_fp8:  # the 16-bit inputs' reference, within 1.1 x the floor the e4m3 cache sets + 1e-3
        from flashtune.measure.fp8_floor import kv_cache_check

        c = varlen_args
        floor = kv_cache_check(out, q, k, v, c["k8"], c["v8"], c["k_descale"], c["v_descale"], case.causal, scale)
        tol = floor.bar
    end_to_end_bar = FP8_ALL_END_TO_END_MAX_REL_ERR if case.fp8_pv else FP8_END_TO_END_MAX_REL_ERR
    if case.fp8_pv:  # the kernel against its own inputs, P's rounding allowed for; the quantisation's cost reported
        end_to_end = rel_l2(out, ref)
        ref, _, tol = all_fp8_reference(q, k, v, case.causal, scale)
    elif case.fp8:  # the kernel against its own inputs; the quantisation's cost is reported
        end_to_end = rel_l2(out, ref)
        ref, _ = attention_reference(*dequantised_qk(q, k), v, case.causal, scale)
        tol = FP8_KERNEL_MAX_REL_ERR
    err = rel_l2(out, ref)
    unwritten = int(torch.isnan(out).sum())
    end_to_end_ok = end_to_end is None or end_to_end <= end_to_end_bar
    correct = Check("correctness", spec.name, err <= tol and unwritten == 0 and end_to_end_ok,
                    f"rel err {err:.2e} <= {tol:.2e}" if err <= tol else f"rel err {err:.2e} > {tol:.2e}",
                    case.name, rel_err=err, tolerance=tol, end_to_end_rel_err=end_to_end)
    if unwritten:
        correct.detail += f"; {unwritten} output elements never written"
    if end_to_end is not None:
        correct.detail += (f"; vs 16-bit inputs {end_to_end:.1e}" if end_to_end_ok else
                           f"; vs 16-bit inputs {end_to_end:.1e} > {end_to_end_bar:.0e}")
    others = unexpected_attention_kernels(names, expected, companions)
    launched = expected in names
    merged = combine_problem(names, spec.combine_name, merge) if isinstance(spec, DecodeSpec) else None
    identity = Check("identity", expected, launched and not others and merged is None,
                     ("launched" if launched else f"expected kernel did not launch; saw {names}")
                     + (f"; other attention kernels ran: {others}" if others else "")
                     + (f"; {merged}" if merged else ""), case.name, observed=names)
    return [correct, identity], spec


def run_verify(profile, expected_kernel: str | None = None, seed: int = 0, on_progress=None,
               jobs: int | None = None, kernels: list | None = None, on_built=None) -> VerifyReport:
    """All checks for a profile on the current GPU, its kernels (`kernels`, default verify_kernels)
    built first, side by side (build_kernels; on_built(spec) as each is done)."""
    import torch

    from flashtune.kernels.build import build_spec
    from flashtune.kernels.toolchain import detect_toolchain

    if kernels is None:
        kernels = verify_kernels(profile, torch.cuda.current_device())
    build_kernels(kernels, jobs, on_done=(lambda spec, _: on_built(spec)) if on_built else None)
    report = VerifyReport(profile.name, profile.arch.name, profile.family)
    specs = {}
    for i, case in enumerate(correctness_cases(profile)):
        case_rows, spec = check_case(case, profile, expected_kernel, seed + i)
        report.rows += case_rows
        specs[spec] = None
        if on_progress:
            on_progress(case)
    cuobjdump = detect_toolchain().cuobjdump_path
    for spec in specs:
        result = build_spec(spec)  # a cache hit: the library the checks above loaded
        report.rows.append(sass_row(spec, result.library, result.spills, cuobjdump))
    return report


# ---------------------------------------------------------------------------- --sdpa

def sdpa_report(dtype: str, hdim: int, seqlen: int, causal: bool, batch: int = 2, heads: int = 16) -> SdpaReport:
    """Which backend SDPA picks for this shape (from kernel names), and why others refuse."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashtune.measure.timing import kernel_names

    q, k, v = (torch.randn(batch, heads, seqlen, hdim, device="cuda", dtype=getattr(torch, dtype))
               for _ in range(3))
    names = kernel_names(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    rows = []
    for backend in SDPA_BACKENDS:
        with warnings.catch_warnings(record=True) as caught, sdpa_kernel([getattr(SDPBackend, backend)]):
            warnings.simplefilter("always")
            try:
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                torch.cuda.synchronize()
                rows.append({"backend": backend, "usable": True, "why": ""})
            except RuntimeError as e:
                reasons = [str(w.message).splitlines()[0] for w in caught] or [str(e).splitlines()[0]]
                rows.append({"backend": backend, "usable": False, "why": " | ".join(reasons)[:400]})
    shape = {"dtype": dtype, "hdim": hdim, "seqlen": seqlen, "causal": causal, "batch": batch, "heads": heads}
    return SdpaReport(shape, names, classify_sdpa(names), rows)


def classify_sdpa(names: list[str]) -> str:
    """The SDPA backend that these kernel names belong to."""
    joined = " ".join(names).lower()
    if "cudnn" in joined:
        return "cudnn"
    if "flash" in joined:
        return "flash"
    if "fmha" in joined or "mem_efficient" in joined or "cutlassf" in joined:
        return "efficient"
    if "gemm" in joined or "softmax" in joined:
        return "math"
    return "unknown"


# ---------------------------------------------------------------------------- how it is shown

def _status(ok) -> str:
    return "[green]pass[/]" if ok else ("[yellow]skip[/]" if ok is None else "[red]FAIL[/]")


def render(report: VerifyReport, console: Console) -> None:
    table = Table(title=f"flashtune verify: profile {report.profile} ({report.family} family, {report.arch})")
    for col in ("check", "case", "kernel", "result", "detail"):
        table.add_column(col, overflow="fold")
    for r in report.rows:
        table.add_row(r.check, r.case, r.kernel, _status(r.ok), r.detail)
    console.print(table)
    counts = {c: sum(r.check == c for r in report.rows) for c in ("correctness", "identity", "sass")}
    verdict = "[green]all checks passed[/]" if report.ok else f"[red]{report.failed} checks failed[/]"
    console.print(f"{verdict} ({counts['correctness']} correctness, {counts['identity']} kernel identity, "
                  f"{counts['sass']} SASS)")


def render_sdpa(reports: list[SdpaReport], console: Console) -> None:
    for report in reports:
        s = report.shape
        table = Table(title=f"PyTorch SDPA for {s['dtype']} b{s['batch']} h{s['heads']} s{s['seqlen']} "
                            f"d{s['hdim']} {'causal' if s['causal'] else 'non-causal'}")
        table.add_column("backend")
        table.add_column("usable")
        table.add_column("why not", overflow="fold")
        for r in report.backends:
            table.add_row(r["backend"], "yes" if r["usable"] else "[red]no[/]", r["why"])
        console.print(table)
        console.print(f"SDPA's own choice: [bold]{report.picked}[/] (kernels: {'; '.join(report.default_kernels)})")
