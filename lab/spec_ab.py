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

from flashtune.measure.backends import BACKENDS, Inputs, _flash_attn_module
from flashtune.measure.reference import attention_reference, rel_l2
from flashtune.measure.timing import time_ms

LAB = Path(__file__).resolve().parent
sys.path.insert(0, str(LAB))
from spec_vote import captured_layers  # noqa: E402

BATCH = 10
ROUNDS = 3


def packages(profile: str, names: list[str]) -> list[str]:
    """Today's flashtune and each lab/NAME-src tree's flashtune_NAME, imported, all under `profile`."""
    for name in names:
        sys.path.insert(0, str(LAB / f"{name}-src"))
        os.environ.setdefault(f"FLASHTUNE_{name.upper()}_CACHE_DIR", f"/tmp/ftc-{name}")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(LAB / f"{n}-src") for n in names]
                                               + [os.environ.get("PYTHONPATH", "")])  # their build workers
    pkgs = ["flashtune"] + [f"flashtune_{n}" for n in names]
    for pkg in pkgs:
        importlib.import_module(pkg).use_profile(profile)
    return pkgs


def errors(out: torch.Tensor, ref: torch.Tensor) -> dict:
    return {"max abs": (out.float() - ref).abs().max().item(), "rel L2": rel_l2(out, ref)}


def compare(pkgs: list[str], layers: list[Inputs], label: str) -> dict:
    """Each package's flash_attn_func and bench's SDPA cuDNN runner on every layer's inputs: the
    worst layer's error against fp32 (attention_reference, a batch row at a time), and the layers'
    summed times in interleaved rounds."""
    makers = {**{pkg: _flash_attn_module(pkg) for pkg in pkgs}, "sdpa-cudnn": BACKENDS["sdpa-cudnn"]}
    runners = {name: [make(inputs) for inputs in layers] for name, make in makers.items()}
    row = {"inputs": label, "errors": {name: {"max abs": 0.0, "rel L2": 0.0} for name in runners},
           "ms": {name: [] for name in runners}}
    for i, inputs in enumerate(layers):
        ref = torch.cat([attention_reference(inputs.q[b:b + 1], inputs.k[b:b + 1], inputs.v[b:b + 1], True)[0]
                         for b in range(inputs.q.shape[0])])
        for name, runs in runners.items():
            worst = row["errors"][name]
            row["errors"][name] = {key: max(worst[key], value) for key, value in errors(runs[i](), ref).items()}
        del ref
    for _ in range(ROUNDS):  # interleaved: each round times every runner's layers
        for name, runs in runners.items():
            row["ms"][name].append(sum(statistics.median(time_ms([run], 3, 10)) for run in runs))
    row["median ms"] = {name: statistics.median(times) for name, times in row["ms"].items()}
    base = row["median ms"]["sdpa-cudnn"]
    print(f"{label}:", flush=True)
    for name in runners:
        e = row["errors"][name]
        print(f"  {name:22s} {row['median ms'][name]:8.3f} ms ({base / row['median ms'][name]:.3f}x cuDNN)  "
              f"max abs {e['max abs']:.2e}, rel L2 {e['rel L2']:.2e}", flush=True)
    return row


def main() -> None:
    from flashtune.commands.bench_model import _subject

    profile, out_path, names = sys.argv[1], sys.argv[2], sys.argv[3:]
    pkgs = packages(profile, names)
    subject = _subject("recall", None, "bfloat16", "cuda", 0, None)
    result = {"gpu": torch.cuda.get_device_name(), "profile": profile,
              "trees": {n: (LAB / f"{n}-src" / "COMMIT").read_text().strip() for n in names}, "rows": []}
    for length in (4096, 16384):
        layers = [Inputs(*(t.transpose(1, 2).contiguous() for t in qkv), causal=True, scale=qkv[0].shape[-1] ** -0.5)
                  for qkv in captured_layers(subject.model, subject.prompts(BATCH, length))]
        result["rows"].append(compare(pkgs, layers, f"trained recall model, {length} tokens"))
        randoms = [Inputs(*(torch.randn_like(t) for t in (x.q, x.k, x.v)), causal=True, scale=x.scale) for x in layers]
        del layers
        result["rows"].append(compare(pkgs, randoms, f"random normal, {length} tokens"))
        del randoms
        json.dump(result, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main()
