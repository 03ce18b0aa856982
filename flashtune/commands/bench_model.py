"""`flashtune bench --model`: the same model, the same prompts, only the attention backend switched.

Per backend and prefill length: time to first token (a prefill plus the first argmax),
decode tokens/s with the KV cache, peak memory, and consistency against the first backend
(max |logit difference|, top-1 agreement over the logits of the prompt's last 4096 positions,
greedy tokens identical for N steps, per prompt), and the host time of one layer's attention call in a
decode step (the Python and launches a faster kernel cannot remove). On a GPU also attention's share of the
prefill's kernel time, from the profiler: the most a faster attention kernel can give the model.

Weights are random (fixed seed): no downloads. transformers is needed (`pip install '.[hf]'`).
"""
from __future__ import annotations

import re
import statistics
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

import torch
from rich.console import Console
from rich.table import Table

from flashtune.commands.bench import checked_backends, environment, pyplot
from flashtune.commands.memory import ModelShape, accounts, find_model

# backend -> (transformers attn_implementation, SDPA backend to force or None)
MODEL_BACKENDS = {
    "flashtune": ("ftune", None),
    "flashtune+sdpa-decode": ("ftune", None),  # prefill through flashtune, decode steps through SDPA
    "sdpa-flash": ("sdpa", "FLASH_ATTENTION"),
    "sdpa-cudnn": ("sdpa", "CUDNN_ATTENTION"),
    "sdpa-efficient": ("sdpa", "EFFICIENT_ATTENTION"),
    "sdpa-math": ("sdpa", "MATH"),
    "eager": ("eager", None),
}
# Backends that materialise the score matrix (`flashtune memory`'s quadratic account).
NON_FLASH_BACKENDS = ("sdpa-math", "eager")
# Kernel names that are attention work, per backend (math/eager: only their softmax can be
# told apart from the model's other GEMMs, so their share is a lower bound).
ATTENTION_KERNELS = {
    "flashtune": r"^flashtune_fwd", "flashtune+sdpa-decode": r"^flashtune_fwd", "sdpa-flash": r"flash_fwd",
    "sdpa-cudnn": r"cudnn|fprop", "sdpa-efficient": r"fmha|cutlassF", "sdpa-math": r"softmax", "eager": r"softmax",
}

DEFAULT_MODEL_BACKENDS = ("flashtune", "sdpa-flash", "sdpa-cudnn", "sdpa-math", "eager")


@dataclass
class ModelRow:
    """One backend at one prompt length; the consistency columns compare with the first backend."""
    backend: str
    prefill: int
    batch: int
    status: str = "ok"  # or why the backend is unavailable
    peak_mem_mb: float | None = None  # the whole model's peak: weights + KV cache + one layer's transients
    predicted_peak_mb: float | None = None  # `flashtune memory`'s accounts for it
    ttft_ms: float | None = None
    decode_tok_s: float | None = None
    attention_share: float | None = None  # of the prefill's kernel time
    attention_host_us: float | None = None  # host time of one layer's attention call in a decode step (median)
    vs: str | None = None  # the backend compared with
    max_abs_logit_diff: float | None = None
    top1_agreement: float | None = None
    greedy_identical: list[bool] | None = None  # per prompt


@dataclass
class ModelBenchResult:
    header: dict | None  # what ran, where (None off the GPU)
    model: str
    layers: int
    dtype: str
    decode_steps: int
    rows: list[ModelRow] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def backend_names(names: list[str] | None) -> list[str]:
    """--backends with --model, checked (default: flashtune, SDPA's flash, cuDNN and math, eager)."""
    return checked_backends(names, MODEL_BACKENDS, DEFAULT_MODEL_BACKENDS, " with --model")


def build_model(shape: ModelShape, layers: int | None, dtype: torch.dtype, device: str, seed: int = 0):
    """A randomly initialised Llama/Qwen2/Mistral-style causal LM of this shape."""
    import transformers

    from flashtune import hf  # noqa: F401  (registers the "ftune" attention)

    if layers:
        shape = replace(shape, layers=layers)
    config_cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
                  "mistral": transformers.MistralConfig}[shape.family]
    config = config_cls(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                        num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                        num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim,
                        tie_word_embeddings=shape.tied_embeddings, max_position_embeddings=131072)
    if shape.family == "mistral":
        config.sliding_window = None  # flashtune has no sliding window; compare like with like
    torch.manual_seed(seed)
    model_cls = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
                 "mistral": transformers.MistralForCausalLM}[shape.family]
    return model_cls._from_config(config, attn_implementation="eager", torch_dtype=dtype).to(device).eval()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed(fn, device: str) -> tuple[object, float]:
    _sync(device)
    start = time.perf_counter()
    result = fn()
    _sync(device)
    return result, time.perf_counter() - start


def _attention_share(model, ids, backend: str) -> float | None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof, torch.no_grad():
        model(ids)
        torch.cuda.synchronize()
    pattern = re.compile(ATTENTION_KERNELS[backend], re.IGNORECASE)
    total = attention = 0.0
    for event in prof.events():
        if event.device_type.name == "CUDA":
            total += event.device_time
            if pattern.search(event.name):
                attention += event.device_time
    return attention / total if total else None


@contextmanager
def _decode_attention_host_time(model, impl: str, seconds: list[float]):
    """While in the context, the host time of every attention call of one query token (a decode
    step, one layer) goes into `seconds`: the Python, checks and launches a decode step pays per
    layer. generate syncs every step, so the launch queue never fills and this is host work, not
    a wait for the GPU. The call is timed through transformers' attention registry, which each
    layer asks per call (eager too, where the registry is asked for it: transformers >= 5)."""
    import sys

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    inner = ALL_ATTENTION_FUNCTIONS.get(impl) or getattr(sys.modules[type(model).__module__],
                                                          "eager_attention_forward", None)
    if inner is None:
        yield
        return

    def timed(module, query, *args, **kwargs):
        if query.shape[2] != 1:
            return inner(module, query, *args, **kwargs)
        start = time.perf_counter()
        result = inner(module, query, *args, **kwargs)
        seconds.append(time.perf_counter() - start)
        return result

    ALL_ATTENTION_FUNCTIONS[impl] = timed  # this instance's own entry, over the registered one
    try:
        yield
    finally:
        del ALL_ATTENTION_FUNCTIONS[impl]


# Consistency compares the logits of each prompt's last positions: all of them at 64k would be
# 16 GiB in bf16 for a 128k vocabulary (and twice that in fp32), which ended a run out of memory.
CONSISTENCY_POSITIONS = 4096
CONSISTENCY_CHUNK = 1024  # positions compared at a time, in fp32


def _consistency(logits: torch.Tensor, ref_logits: torch.Tensor, device: str) -> tuple[float, float]:
    """(max |logit difference|, top-1 agreement) against the reference kept on the CPU, a chunk of
    positions at a time so the comparison never holds more than two chunks in fp32 on the GPU."""
    worst, agree = 0.0, 0
    for i in range(logits.shape[0]):
        for start in range(0, logits.shape[1], CONSISTENCY_CHUNK):
            ours = logits[i, start:start + CONSISTENCY_CHUNK].float()
            ref = ref_logits[i, start:start + CONSISTENCY_CHUNK].to(device).float()
            worst = max(worst, (ours - ref).abs().max().item())
            agree += (ours.argmax(-1) == ref.argmax(-1)).sum().item()
    return worst, agree / (logits.shape[0] * logits.shape[1])


def run_model_bench(model_name: str, backends: list[str], prefill: list[int], batch: int = 1,
                    decode_steps: int = 128, layers: int | None = None, dtype: str = "bfloat16",
                    repeats: int = 3, device: str = "cuda", seed: int = 0,
                    checkpoint: Callable[[ModelBenchResult], None] | None = None) -> ModelBenchResult:
    """Per prefill length and backend: TTFT (a prefill that keeps the KV cache and computes the
    last position's logits, as serving does), its peak memory next to `flashtune memory`'s
    prediction, decode tokens/s, attention's share and consistency with the first backend.
    `checkpoint` gets the result after each row (bench --out writes it: a long run keeps what
    it measured); a backend out of memory at a length is that row's status, and the run goes on."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    shape = find_model(model_name)
    model = build_model(shape, layers, getattr(torch, dtype), device, seed)
    from flashtune import hf  # imported by build_model: transformers is there
    shape = replace(shape, layers=layers or shape.layers)
    cuda = device.startswith("cuda")
    result = ModelBenchResult(environment() if cuda else None, model_name, shape.layers, dtype, decode_steps)
    first = {}
    for length in prefill:
        gen = torch.Generator(device="cpu").manual_seed(seed + length)
        ids = torch.randint(0, shape.vocab, (batch, length), generator=gen).to(device)
        for name in backends:
            impl, sdpa_backend = MODEL_BACKENDS[name]
            row = ModelRow(name, length, batch)
            context = (lambda: sdpa_kernel([getattr(SDPBackend, sdpa_backend)])) if sdpa_backend else nullcontext
            try:
                hf.set_decode_route("sdpa" if name.endswith("+sdpa-decode") else "flashtune")
                model.set_attn_implementation(impl)
                with context(), torch.no_grad():
                    ttfts = []
                    for _ in range(repeats):
                        if cuda:
                            torch.cuda.empty_cache()
                            torch.cuda.reset_peak_memory_stats()
                        _, seconds = _timed(lambda: model(ids, use_cache=True, logits_to_keep=1).logits.argmax(-1),
                                            device)
                        ttfts.append(seconds)
                    if cuda:  # the whole model's peak: weights + KV cache + one layer's transients
                        row.peak_mem_mb = round(torch.cuda.max_memory_allocated() / 2**20, 1)
                    flash = name not in NON_FLASH_BACKENDS
                    predicted = accounts(shape, batch, length, dtype).total(flash=flash)
                    row.predicted_peak_mb = round(predicted / 2**20, 1)
                    # the last positions' logits, for the consistency columns
                    logits = model(ids, logits_to_keep=min(length, CONSISTENCY_POSITIONS)).logits
                    host_seconds: list[float] = []
                    with _decode_attention_host_time(model, impl, host_seconds):
                        tokens, gen_seconds = _timed(lambda: model.generate(
                            ids, max_new_tokens=decode_steps, min_new_tokens=decode_steps, do_sample=False), device)
                    if host_seconds:
                        row.attention_host_us = 1e6 * statistics.median(host_seconds)
                    row.ttft_ms = 1e3 * statistics.median(ttfts)
                    decode_seconds = max(gen_seconds - statistics.median(ttfts), 1e-9)
                    row.decode_tok_s = batch * (decode_steps - 1) / decode_seconds
                    if cuda:
                        row.attention_share = _attention_share(model, ids, name)
            except torch.cuda.OutOfMemoryError as e:  # this length does not fit this backend
                row.status = f"out of memory: {str(e).splitlines()[0][:200]}"
                _add(result, row, checkpoint, free=cuda)
                continue
            except (RuntimeError, ValueError) as e:  # a backend that refuses this model or shape
                row.status = f"unavailable: {str(e).splitlines()[0][:200]}"
                _add(result, row, checkpoint, free=cuda)
                continue
            finally:
                hf.set_decode_route("flashtune")
            if length not in first:
                first[length] = (name, logits.cpu(), tokens)
            ref = first[length]
            row.vs = ref[0]
            try:
                row.max_abs_logit_diff, row.top1_agreement = _consistency(logits, ref[1], device)
            except torch.cuda.OutOfMemoryError:  # the timings stand; the comparison says why it is missing
                row.status = "ok; consistency not computed: out of memory comparing the logits"
                torch.cuda.empty_cache()
            row.greedy_identical = (tokens == ref[2]).all(dim=1).tolist()
            del logits
            _add(result, row, checkpoint)
        first.pop(length, None)  # the next length has its own reference
    return result


def _add(result: ModelBenchResult, row: ModelRow, checkpoint, free: bool = False) -> None:
    """A finished row into the result, and the result to the checkpoint; after a failed row, the
    memory its tensors held back to the GPU for the next."""
    result.rows.append(row)
    if free:
        torch.cuda.empty_cache()
    if checkpoint:
        checkpoint(result)


# ---------------------------------------------------------------------------- how it is shown

def plot(result: ModelBenchResult, path: str) -> None:
    """`bench --model`: TTFT, decode tokens/s and peak memory against prefill length per backend."""
    plt = pyplot()
    panels = (("ttft_ms", "time to first token (ms)"), ("decode_tok_s", "decode tokens/s"),
              ("peak_mem_mb", "prefill peak memory (MB)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    backends = list(dict.fromkeys(r.backend for r in result.rows))
    for ax, (key, label) in zip(axes.flat, panels):
        for backend in backends:
            points = sorted((r.prefill, getattr(r, key)) for r in result.rows
                            if r.backend == backend and getattr(r, key) is not None)
            style = dict(linewidth=2.5, marker="o") if backend == "flashtune" else dict(marker=".")
            ax.plot([p[0] for p in points], [p[1] for p in points], label=backend, **style)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("prefill length")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(f"flashtune bench --model {result.model} ({result.layers} layers, {result.dtype})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def render(result: ModelBenchResult, console: Console) -> None:
    """`bench --model`: one line per (prefill length, backend)."""
    table = Table(title=f"flashtune bench --model {result.model} ({result.layers} layers, {result.dtype}, "
                        f"{result.decode_steps} decode steps)")
    for col in ("prefill", "backend", "TTFT ms", "decode tok/s", "peak MB", "predicted MB", "attention share",
                "attn host us", "vs", "max |dlogit|", "top-1 agree", "greedy same", "status"):
        table.add_column(col, justify="left" if col in ("backend", "vs", "status") else "right", overflow="fold")

    def num(row, key, fmt):
        return format(getattr(row, key), fmt) if getattr(row, key) is not None else "-"

    for r in result.rows:
        greedy = r.greedy_identical
        table.add_row(str(r.prefill), r.backend, num(r, "ttft_ms", ".1f"), num(r, "decode_tok_s", ".0f"),
                      num(r, "peak_mem_mb", ".0f"), num(r, "predicted_peak_mb", ".0f"),
                      num(r, "attention_share", ".0%"), num(r, "attention_host_us", ".0f"), r.vs or "-",
                      num(r, "max_abs_logit_diff", ".3g"), num(r, "top1_agreement", ".1%"),
                      f"{sum(greedy)}/{len(greedy)}" if greedy else "-",
                      r.status if r.status == "ok" else f"[yellow]{r.status}[/]")
    console.print(table)
