"""Issue 34: the sm90 prefill's speculative step (spec_max) on a trained model's attention, where its
vote fails (lab/spec_vote.py). One process: the bench's trained recall model (trained here first, ~100 s,
then cached), each layer's q, k, v at 4k and 16k tokens (batch 10, after RoPE) captured in its forward;
on those inputs, and on random ones of the same shape, every flashtune tree's causal prefill (today's
package, and each flashtune_NAME that lab/make_release.sh COMMIT NAME made) beside SDPA cuDNN: CUDA-event
times of the four layers' calls in interleaved rounds, and each output's error against an fp32 reference.

    PYTHONPATH=. python3 lab/spec_ab.py PROFILE OUT.json [NAME...]   (device, repository root)
"""
import importlib
import json
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashtune.measure.timing import time_ms

LAB = Path(__file__).resolve().parent
BATCH = 10
ROUNDS = 3


def packages(profile: str, names: list[str]) -> dict:
    """flash_attn_func of today's flashtune and of each lab/NAME-src tree, all under `profile`."""
    for name in names:
        sys.path.insert(0, str(LAB / f"{name}-src"))
        os.environ.setdefault(f"FLASHTUNE_{name.upper()}_CACHE_DIR", f"/tmp/ftc-{name}")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(LAB / f"{n}-src") for n in names]
                                               + [os.environ.get("PYTHONPATH", "")])  # their build workers
    fns = {}
    for pkg in ["flashtune"] + [f"flashtune_{n}" for n in names]:
        module = importlib.import_module(pkg)
        module.use_profile(profile)
        fns[pkg] = module.flash_attn_func
    return fns


def captured(model, ids: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
    """Each layer's (q, k, v) as flash_attn takes them, (batch, seqlen, heads, d), contiguous."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    layers = []

    def record(module, query, key, value, attention_mask, **kwargs):
        layers.append(tuple(t.transpose(1, 2).contiguous() for t in (query, key, value)))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("spec_ab_record", record)
    model.set_attn_implementation("spec_ab_record")
    with torch.no_grad():
        model(ids, use_cache=False, logits_to_keep=1)
    return layers


def cudnn(q, k, v):
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=True, enable_gqa=True).transpose(1, 2)


def reference(q, k, v) -> torch.Tensor:
    """fp32 causal attention, one batch row at a time, the KV heads repeated for their query heads."""
    ratio = q.shape[2] // k.shape[2]
    rows = []
    for b in range(q.shape[0]):
        qb, kb, vb = (t[b:b + 1].float().transpose(1, 2) for t in (q, k, v))
        kb, vb = (t.repeat_interleave(ratio, dim=1) for t in (kb, vb))
        rows.append(F.scaled_dot_product_attention(qb, kb, vb, is_causal=True).transpose(1, 2))
    return torch.cat(rows)


def errors(out: torch.Tensor, ref: torch.Tensor) -> dict:
    diff = out.float() - ref
    return {"max abs": diff.abs().max().item(), "rel L2": (diff.norm() / ref.norm()).item()}


def compare(fns: dict, layers: list[tuple[torch.Tensor, ...]], label: str) -> dict:
    impls = {**{pkg: (lambda q, k, v, f=fn: f(q, k, v, causal=True)) for pkg, fn in fns.items()}, "sdpa-cudnn": cudnn}
    row = {"inputs": label, "errors": {}, "ms": {name: [] for name in impls}}
    refs = [reference(*qkv) for qkv in layers]
    for name, impl in impls.items():
        worst = {"max abs": 0.0, "rel L2": 0.0}
        for qkv, ref in zip(layers, refs):
            out = impl(*qkv)
            worst = {key: max(worst[key], value) for key, value in errors(out, ref).items()}
        row["errors"][name] = worst
    del refs
    for _ in range(ROUNDS):  # interleaved: each round times every impl's four layers
        for name, impl in impls.items():
            per_layer = [statistics.median(time_ms([lambda qkv=qkv: impl(*qkv)], 3, 10)) for qkv in layers]
            row["ms"][name].append(sum(per_layer))
    row["median ms"] = {name: statistics.median(times) for name, times in row["ms"].items()}
    base = row["median ms"]["sdpa-cudnn"]
    print(f"{label}:", flush=True)
    for name in impls:
        e = row["errors"][name]
        print(f"  {name:22s} {row['median ms'][name]:8.3f} ms ({base / row['median ms'][name]:.3f}x cuDNN)  "
              f"max abs {e['max abs']:.2e}, rel L2 {e['rel L2']:.2e}", flush=True)
    return row


def main() -> None:
    from flashtune.commands.bench_model import _subject

    profile, out_path, names = sys.argv[1], sys.argv[2], sys.argv[3:]
    fns = packages(profile, names)
    subject = _subject("recall", None, "bfloat16", "cuda", 0, None)
    result = {"gpu": torch.cuda.get_device_name(), "profile": profile,
              "trees": {n: (LAB / f"{n}-src" / "COMMIT").read_text().strip() for n in names}, "rows": []}
    for length in (4096, 16384):
        layers = captured(subject.model, subject.prompts(BATCH, length))
        result["rows"].append(compare(fns, layers, f"trained recall model, {length} tokens"))
        randoms = [tuple(torch.randn_like(t) for t in qkv) for qkv in layers]
        del layers
        result["rows"].append(compare(fns, randoms, f"random normal, {length} tokens"))
        del randoms
        json.dump(result, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main()
