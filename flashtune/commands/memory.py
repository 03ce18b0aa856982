"""`flashtune memory`: what a model needs in GPU memory, and what a flash kernel changes.

Three accounts, each with how it grows:
* weights: fixed;
* KV cache: linear in batch x sequence length (2 x layers x kv_heads x head_dim per token);
* the attention score matrix a non-flash kernel materialises: quadratic in sequence length,
  one layer at a time (batch x heads x seqlen_q x seqlen_k elements, about 9 bytes each at
  the peak: scores, their fp32 softmax and the 16-bit probabilities, as measured for SDPA's
  math backend on an H200). A flash kernel holds none of it.
Plus the transient activations of one layer and torch's cuBLAS workspace. Everything is bytes.

The transient peak of a Llama-style prefill (transformers, eager PyTorch) is a layer's gated MLP,
evaluated as down(act(gate(x)) * up(x)): at the multiply, act(gate(x)), up(x) and their product
are live (3 x intermediate per token) beside four hidden-size tensors (the embeddings, which the
model's forward keeps to its end, the layer's input, the residual after attention and the normed
input) and the rotary cos/sin tables (2 x head_dim per token where the call passes position ids of
shape (batch, seqlen), as generate does; one copy for the batch without them, which this counts
per token all the same). Counted by tracking every tensor's bytes through transformers' Llama
forward (on the CPU, where the same tensors live): for the recall model at batch 2 without position
ids 14,724 bytes per token, this formula's 14,848 (the tables counted per token).
That is the peak where the MLP is at least about twice the hidden size (Llama's 2.75x, every model
here); a narrower MLP peaks in attention instead (q, k, v, their rotated copies, the output),
which this estimate does not model.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "int8": 1, "int4": 0.5}
# Peak bytes per score element of a non-flash attention (bf16 inputs): measured for SDPA's
# math backend on the H200 (benchmarks/h200/..._fa-grid.json: 9.1-9.4 at seqlen >= 8k).
SCORE_BYTES_PER_ELEMENT = 9
# torch's cuBLAS workspace on sm_90 and newer (32 MiB a stream, allocated through its caching
# allocator at the first matmul; about 8 MiB on sm_80-sm_89, counted as 32 here): the fixed step in
# the H100 model bench's peaks between one backend and the next.
CUBLAS_WORKSPACE_BYTES = 32 * 2**20


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # gated MLP (gate, up, down)
    vocab: int
    tied_embeddings: bool = False
    family: str = "llama"  # which transformers architecture builds it: llama, qwen2 or mistral

    @property
    def params(self) -> int:
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)  # q, o and k, v
        mlp = 3 * self.hidden * self.intermediate
        per_layer = attn + mlp + 2 * self.hidden  # + two RMSNorm weights
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.layers * per_layer + embeddings + self.hidden  # + the final norm


# Shapes of public model families (random weights are enough for memory and speed).
MODELS: dict[str, ModelShape] = {m.name: m for m in (
    ModelShape("llama3-8b-like", 32, 4096, 32, 8, 128, 14336, 128256),
    ModelShape("llama3-70b-like", 80, 8192, 64, 8, 128, 28672, 128256),
    ModelShape("qwen2-7b-like", 28, 3584, 28, 4, 128, 18944, 152064, family="qwen2"),
    ModelShape("mistral-7b-like", 32, 4096, 32, 8, 128, 14336, 32768, family="mistral"),
)}


def model_from_config(path: str | Path) -> ModelShape:
    """A transformers-style config.json (Llama, Qwen2, Mistral keys)."""
    try:
        cfg = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read a model config: {e}") from e
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: a model config is a JSON object, got a {type(cfg).__name__}")
    needed = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
    missing = [key for key in needed if key not in cfg]
    if missing:
        raise ValueError(f"{path}: missing {', '.join(missing)}; needed: {', '.join(needed)}")
    heads = cfg["num_attention_heads"]
    sizes = {key: cfg[key] for key in needed}
    sizes["num_key_value_heads"] = cfg.get("num_key_value_heads") or heads
    hidden = cfg["hidden_size"]
    sizes["head_dim"] = cfg.get("head_dim") or (hidden // heads if _positive(heads) and _positive(hidden) else 0)
    bad = [f"{key} = {value!r}" for key, value in sizes.items() if not _positive(value)]
    if bad:
        raise ValueError(f"{path}: {', '.join(bad)}; each must be a whole number of 1 or more")
    if heads % sizes["num_key_value_heads"]:
        raise ValueError(f"{path}: num_key_value_heads ({sizes['num_key_value_heads']}) must divide "
                         f"num_attention_heads ({heads})")
    return ModelShape(
        name=Path(path).parent.name if Path(path).name == "config.json" else Path(path).stem,
        layers=cfg["num_hidden_layers"], hidden=cfg["hidden_size"], heads=heads,
        kv_heads=sizes["num_key_value_heads"], head_dim=sizes["head_dim"],
        intermediate=cfg["intermediate_size"], vocab=cfg["vocab_size"],
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        family=cfg.get("model_type") if cfg.get("model_type") in ("llama", "qwen2", "mistral") else "llama")


def _positive(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def find_model(name_or_path: str) -> ModelShape:
    """A built-in shape by name, a config.json, or a model's folder holding one (a Hugging Face snapshot)."""
    if name_or_path in MODELS:
        return MODELS[name_or_path]
    path = Path(name_or_path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"{name_or_path}: a folder without a config.json; give the model's config.json")
        return model_from_config(path / "config.json")
    if path.is_file():
        return model_from_config(name_or_path)
    if len(path.parts) > 1 or path.suffix == ".json":
        raise ValueError(f"{name_or_path}: no such file; give a config.json's path or a built-in model "
                         f"({', '.join(MODELS)})")
    raise ValueError(f"unknown model {name_or_path!r}; built in: {', '.join(MODELS)}, or a path to a config.json")


@dataclass(frozen=True)
class Accounts:
    weights: int
    kv_cache: int
    score_matrix: int  # one layer's, for a non-flash kernel; 0 with a flash kernel
    activations: int  # one layer's transient tensors (estimate)
    workspace: int = CUBLAS_WORKSPACE_BYTES

    def total(self, flash: bool) -> int:
        return (self.weights + self.kv_cache + self.activations + self.workspace
                + (0 if flash else self.score_matrix))


def accounts(model: ModelShape, batch: int, seqlen: int, dtype: str = "bfloat16",
             kv_dtype: str | None = None) -> Accounts:
    elem = DTYPE_BYTES[dtype]
    kv_elem = DTYPE_BYTES[kv_dtype or dtype]
    tokens = batch * seqlen
    return Accounts(
        weights=int(model.params * elem),
        kv_cache=int(2 * model.layers * model.kv_heads * model.head_dim * tokens * kv_elem),
        score_matrix=batch * model.heads * seqlen * seqlen * SCORE_BYTES_PER_ELEMENT,
        activations=int(tokens * (3 * model.intermediate + 4 * model.hidden + 2 * model.head_dim) * elem),
    )


@dataclass
class MemoryReport:
    model: ModelShape
    batch: int
    seqlen: int
    dtype: str
    kv_dtype: str
    gpu_bytes: int | None
    accounts: Accounts
    verdict: list[str]
    advice: list[str]
    assumed: list[str]  # what a model given by its attention shape alone took for granted

    @property
    def total_with_flash(self) -> int:
        return self.accounts.total(flash=True)

    @property
    def total_without_flash(self) -> int:
        return self.accounts.total(flash=False)

    def to_json(self) -> dict:
        return {**asdict(self), "params": self.model.params, "total_with_flash": self.total_with_flash,
                "total_without_flash": self.total_without_flash}


def report(model: ModelShape, batch: int, seqlen: int, gpu_bytes: int | None, dtype: str = "bfloat16",
           kv_dtype: str | None = None, assumed: list[str] | None = None) -> MemoryReport:
    """The accounts, the totals with and without a flash kernel, and a plain verdict."""
    acc = accounts(model, batch, seqlen, dtype, kv_dtype)
    with_flash, without_flash = acc.total(flash=True), acc.total(flash=False)
    verdict, advice = [], []
    if gpu_bytes is None:
        verdict.append("GPU memory unknown (no GPU visible): pass --gpu-memory GIB for a verdict")
    else:
        gb = gpu_bytes / 2**30
        if without_flash <= gpu_bytes:
            verdict.append(f"fits in {gb:.0f} GiB with any attention kernel")
        elif with_flash <= gpu_bytes:
            verdict.append(f"fits in {gb:.0f} GiB only with a flash kernel: a non-flash one would need "
                           f"{acc.score_matrix / 2**30:.1f} GiB more for one layer's score matrix")
        else:
            largest = max(("weights", acc.weights), ("KV cache", acc.kv_cache),
                          ("activations", acc.activations), key=lambda kv: kv[1])[0]
            verdict.append(f"does not fit in {gb:.0f} GiB even with a flash kernel "
                           f"({with_flash / 2**30:.1f} GiB); the largest account is the {largest}")
    if acc.score_matrix > 0.05 * with_flash:
        advice.append(f"a flash kernel removes the {acc.score_matrix / 2**30:.1f} GiB score matrix (quadratic in "
                      "sequence length); it does not shrink weights or the KV cache")
    if (kv_dtype or dtype) in ("bfloat16", "float16") and acc.kv_cache > 0.1 * with_flash:
        advice.append(f"an FP8 KV cache halves the {acc.kv_cache / 2**30:.1f} GiB KV cache (linear in length)")
    ratio = model.heads // model.kv_heads
    advice.append(f"GQA: {model.heads} query heads share {model.kv_heads} KV heads, so the KV cache is already "
                  f"{ratio}x smaller than with full multi-head attention" if ratio > 1 else
                  "GQA/MQA (fewer KV heads) would shrink the KV cache; this model has one KV head per query head")
    advice.append("more GPUs (tensor parallel) divide the weights and the KV cache between them")
    return MemoryReport(model, batch, seqlen, dtype, kv_dtype or dtype, gpu_bytes, acc, verdict, advice,
                        list(assumed or ()))


def with_overrides(model: ModelShape, **overrides) -> ModelShape:
    """The model with any of layers/heads/kv_heads/head_dim given on the command line."""
    changes = {k: v for k, v in overrides.items() if v is not None}
    if changes.get("kv_heads") and (changes.get("heads") or model.heads) % changes["kv_heads"]:
        raise ValueError("--kv-heads must divide --heads")
    return replace(model, **changes) if changes else model


def custom_model(layers: int, heads: int, kv_heads: int | None, head_dim: int, hidden: int | None = None,
                 intermediate: int | None = None, vocab: int | None = None) -> tuple[ModelShape, list[str]]:
    """A Llama-style model from the attention shape alone; returns it and what was assumed."""
    assumed = []
    if hidden is None:
        hidden = heads * head_dim
        assumed.append(f"hidden = heads x head_dim = {hidden}")
    if intermediate is None:
        intermediate = -(-(8 * hidden // 3) // 256) * 256  # Llama's 8/3 x hidden, rounded up to 256
        assumed.append(f"intermediate = 8/3 x hidden = {intermediate} (Llama's rule)")
    if vocab is None:
        vocab = 32000
        assumed.append("vocab = 32000")
    kv = kv_heads or heads
    if heads % kv:
        raise ValueError("--kv-heads must divide --heads")
    return ModelShape("custom", layers, hidden, heads, kv, head_dim, intermediate, vocab), assumed


def model_from_options(name_or_path: str | None, **attention_shape) -> tuple[ModelShape, list[str]]:
    """The model the command line describes: --model (with any shape options over it), or the
    attention shape alone (--layers --heads --hdim at least); and what was assumed."""
    if name_or_path:
        return with_overrides(find_model(name_or_path), **attention_shape), []
    shape = attention_shape
    if not (shape.get("layers") and shape.get("heads") and shape.get("head_dim")):
        raise click.UsageError("give --model, or --layers, --heads and --hdim")
    return custom_model(shape["layers"], shape["heads"], shape.get("kv_heads"), shape["head_dim"], shape.get("hidden"),
                        shape.get("intermediate"), shape.get("vocab"))


# ---------------------------------------------------------------------------- how it is shown

def _gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB"


def render(rep: MemoryReport, console: Console) -> None:
    m, acc = rep.model, rep.accounts
    console.print(f"[bold]{m.name}[/]: {m.params / 1e9:.2f} B parameters, {m.layers} layers, "
                  f"{m.heads} heads / {m.kv_heads} KV heads x {m.head_dim}; batch {rep.batch}, "
                  f"seqlen {rep.seqlen}, {rep.dtype} (KV cache {rep.kv_dtype})")
    table = Table(title="memory accounts")
    for col in ("account", "grows with", "size", "with a flash kernel"):
        table.add_column(col, justify="right" if col in ("size", "with a flash kernel") else "left")
    table.add_row("weights", "fixed", _gib(acc.weights), _gib(acc.weights))
    table.add_row("KV cache", "batch x seqlen (linear)", _gib(acc.kv_cache), _gib(acc.kv_cache))
    table.add_row("attention scores (one layer)", "batch x heads x seqlen^2 (quadratic)",
                  _gib(acc.score_matrix), _gib(0))
    table.add_row("activations (one layer, estimate)", "batch x seqlen", _gib(acc.activations),
                  _gib(acc.activations))
    table.add_row("cuBLAS workspace", "fixed", _gib(acc.workspace), _gib(acc.workspace))
    table.add_row("[bold]total[/]", "", f"[bold]{_gib(rep.total_without_flash)}[/]",
                  f"[bold]{_gib(rep.total_with_flash)}[/]")
    console.print(table)
    if rep.gpu_bytes:
        console.print(f"GPU memory: {_gib(rep.gpu_bytes)}")
    for line in rep.assumed:
        console.print(f"[dim]assumed: {line}[/]")
    for line in rep.verdict:
        console.print(f"[bold]verdict:[/] {line}")
    for line in rep.advice:
        console.print(f"  - {line}")
