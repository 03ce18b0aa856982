"""`flashtune bench --model`: the same model, the same prompts, only the attention backend switched.

Per backend and prefill length: time to first token (a prefill plus the first argmax), decode
tokens/s, peak memory, and consistency against the first backend (max |logit difference|,
top-1 agreement over the prompts' logits, greedy tokens identical for N steps, per prompt).

Decode is measured in one harness for every backend: a static KV cache, each step replayed from
a CUDA graph on a GPU (no host work per step, as a serving engine runs it), with one step's
kernels profiled (attention's share of the step, and the K/V bytes its attention kernels read
per second); beside it transformers' generate with its dynamic cache, whose steps pay the host
work of every layer's call (reported too: one layer's attention call, on the host).

Weights are random (fixed seed, no downloads), except for `--model recall`: a small Llama-style
model the bench trains itself on associative recall (flashtune/measure/recall_model.py), whose
logits are confident, so that backend agreement means something; its rows add the task's
accuracy and the agreement with fp32 math. transformers is needed (`pip install '.[hf]'`).
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
from flashtune.measure.timing import warm_up

# backend -> (transformers attn_implementation, SDPA backend to force or None)
MODEL_BACKENDS = {
    "flashtune": ("ftune", None),
    "sdpa": ("sdpa", None),  # SDPA's own choice of kernel: what a model gets by default
    "sdpa-flash": ("sdpa", "FLASH_ATTENTION"),
    "sdpa-cudnn": ("sdpa", "CUDNN_ATTENTION"),
    "sdpa-efficient": ("sdpa", "EFFICIENT_ATTENTION"),
    "sdpa-math": ("sdpa", "MATH"),
    "eager": ("eager", None),
    "flash-attn2": ("flash_attention_2", None),  # transformers' FlashAttention-2 route, where flash_attn imports
}
# Backends that materialise the score matrix (`flashtune memory`'s quadratic account).
NON_FLASH_BACKENDS = ("sdpa-math", "eager")
# Kernel names that are attention work, per backend (math/eager: only their softmax can be
# told apart from the model's other GEMMs, so their share is a lower bound).
ATTENTION_KERNELS = {
    "flashtune": r"^flashtune_", "sdpa": r"flash_fwd|cudnn|fprop|fmha|cutlassF|softmax", "sdpa-flash": r"flash_fwd",
    "sdpa-cudnn": r"cudnn|fprop", "sdpa-efficient": r"fmha|cutlassF", "sdpa-math": r"softmax", "eager": r"softmax",
    "flash-attn2": r"flash_fwd",
}

DEFAULT_MODEL_BACKENDS = ("flashtune", "sdpa", "sdpa-flash", "sdpa-cudnn", "sdpa-math", "eager", "flash-attn2")
# The defaults: prompts of 1k to 128k tokens (each row that `flashtune memory` predicts to fit) at batch 1
# and 16, 256 greedy decode steps.
DEFAULT_PREFILL = (1024, 16384, 65536, 131072)
DEFAULT_BATCHES = (1, 16)
DEFAULT_DECODE_STEPS = 256
# Untimed prefills before a row's clocks, for at least this long on a GPU (timing.warm_up): at 1k
# tokens a 32-layer prefill is launch-bound, and an H100 run's first row, after one untimed prefill,
# took 37.5 ms where the same cuDNN kernels took 31.8 ms a row later (2026-12-07,
# lab/results/2026-12-07c_h100-visit/).
PREFILL_WARMUP_SECONDS = 1.0
TRAINED_MODEL = "recall"  # --model recall: the model the bench trains (flashtune/measure/recall_model.py)
RECALL_RECIPE = None  # None: recall_model.Recipe()


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
    decode_tok_s: float | None = None  # static cache, each step replayed from a CUDA graph on a GPU
    generate_tok_s: float | None = None  # transformers' generate, dynamic cache: host work per step included
    attention_share: float | None = None  # of the prefill's kernel time
    decode_attention_share: float | None = None  # of one decode step's kernel time
    decode_attention_gbps: float | None = None  # K/V bytes a decode step reads over its attention kernels' time
    attention_host_us: float | None = None  # host time of one layer's attention call in a decode step (median)
    vs: str | None = None  # the backend compared with
    max_abs_logit_diff: float | None = None
    top1_agreement: float | None = None
    greedy_identical: list[bool] | None = None  # per prompt
    recall_accuracy: float | None = None  # --model recall: top-1 on the task's recall positions
    fp32_max_abs_logit_diff: float | None = None  # --model recall: against fp32 math on the same weights
    fp32_top1_agreement: float | None = None


@dataclass
class ModelBenchResult:
    header: dict | None  # what ran, where (None off the GPU)
    model: str
    layers: int
    dtype: str
    decode_steps: int
    rows: list[ModelRow] = field(default_factory=list)
    training: dict | None = None  # --model recall: the recipe, its seed, loss curve and held-out accuracy

    def to_json(self) -> dict:
        return asdict(self)


def backend_names(names: list[str] | None) -> list[str]:
    """--backends with --model, checked (default: DEFAULT_MODEL_BACKENDS)."""
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
                        tie_word_embeddings=shape.tied_embeddings,
                        max_position_embeddings=2**18)  # a 128k prompt and its decode steps
    if shape.family == "mistral":
        config.sliding_window = None  # full attention, as the other families' rows time (flashtune has windows too)
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


def _kernel_times(fn, backend: str) -> tuple[float, float]:
    """(attention kernels' busy time, all kernels' busy time) in seconds of fn's run, from the
    profiler: the union of the kernels' intervals, not the sum of their durations, because kernels
    overlap. flashtune's combine kernel is the split kernel's programmatic dependent (sm_90): it
    starts while the split kernel runs and waits for it, and a sum would count that wait twice."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof, torch.no_grad():
        fn()
        torch.cuda.synchronize()
    pattern = re.compile(ATTENTION_KERNELS[backend], re.IGNORECASE)
    kernels = [(e.time_range.start, e.time_range.end, bool(pattern.search(e.name)))
               for e in prof.events() if e.device_type.name == "CUDA"]
    attention = busy_time([(start, end) for start, end, hit in kernels if hit])
    return attention * 1e-6, busy_time([(start, end) for start, end, _ in kernels]) * 1e-6


def busy_time(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of (start, end) intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _attention_share(model, ids, backend: str) -> float | None:
    """Attention's share of the kernel time of the prefill TTFT times (the last position's logits
    only: all positions' would add an LM head over every token, 16 GiB of logits at 64k tokens)."""
    attention, total = _kernel_times(lambda: model(ids, use_cache=True, logits_to_keep=1), backend)
    return attention / total if total else None


def _prefilled_static_cache(model, ids: torch.Tensor, room: int):
    """A static KV cache with room for `room` tokens after the prompts `ids`, filled by their
    prefill: (the forward's cache keyword, the first greedy token, its position)."""
    import inspect

    from transformers import StaticCache

    length = ids.shape[1]
    cache = {("cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"):
             StaticCache(config=model.config, max_cache_len=length + room)}  # its name since transformers 5.25
    logits = model(ids, cache_position=torch.arange(length, device=ids.device), use_cache=True,
                   logits_to_keep=1, **cache).logits
    return cache, logits[:, -1].argmax(-1, keepdim=True), torch.tensor([length], device=ids.device)


def static_decode(model, ids: torch.Tensor, steps: int, graph: bool):
    """Greedy decoding of `steps` tokens after the prompts `ids`, on a static KV cache, each step
    one forward of one token per sequence; with `graph` (a GPU) the step is captured once in a
    CUDA graph and replayed, the token and position fed through its input buffers, so no host
    work repeats. Every forward is a real next step (transformers since about 5.20 counts a static
    cache's writes itself and ignores cache_position, so a repeated step would write a second
    row): the graph's warm-up is the first token. Returns (tokens (batch, steps), seconds per
    step over the timed replays)."""
    with torch.no_grad():
        cache, token, position = _prefilled_static_cache(model, ids, steps)
        tokens = [token.clone()]

        def step():
            out = model(token, cache_position=position, use_cache=True, **cache).logits
            return out[:, -1].argmax(-1, keepdim=True)

        def advance(new_token):  # the step's token becomes the next step's input
            tokens.append(new_token.clone())
            token.copy_(new_token)
            position.add_(1)

        if graph:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                advance(step())  # the warm-up before capture
            torch.cuda.current_stream().wait_stream(side)
            captured = torch.cuda.CUDAGraph()
            with torch.cuda.graph(captured):  # recorded, not run: the cache is not written
                next_token = step()
            run = captured.replay
        else:
            next_token = torch.empty_like(token)
            run = lambda: next_token.copy_(step())  # noqa: E731
        if len(tokens) + 2 > steps:
            raise ValueError(f"a static decode of {steps} tokens times none of them; ask for at least "
                             f"{len(tokens) + 2} decode steps")
        run()  # the first replay, untimed (a graph's first launch uploads it)
        advance(next_token)
        _sync(ids.device.type)
        timed = steps - len(tokens)
        start = time.perf_counter()
        for _ in range(timed):
            run()
            advance(next_token)
        _sync(ids.device.type)
        seconds = time.perf_counter() - start
    return torch.cat(tokens, dim=1), seconds / timed


def decode_step_kernel_times(model, ids: torch.Tensor, backend: str) -> tuple[float, float]:
    """(attention kernels' time, all kernels' time) in seconds of one decode step after the
    prompts `ids` on a static cache, from the profiler."""
    with torch.no_grad():
        cache, token, position = _prefilled_static_cache(model, ids, 1)
        return _kernel_times(lambda: model(token, cache_position=position, use_cache=True, **cache), backend)


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
# A small vocabulary (the trained model's) has every position compared.
CONSISTENCY_POSITIONS = 4096
CONSISTENCY_ELEMENTS = 2**28  # logits kept per prompt at most: 512 MiB in bf16
CONSISTENCY_CHUNK = 1024  # positions compared at a time, in fp32


def consistency_positions(length: int, vocab: int) -> int:
    return min(length, max(CONSISTENCY_POSITIONS, CONSISTENCY_ELEMENTS // vocab))


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


@dataclass
class _Subject:
    """What the bench runs: the model, its shape (for `flashtune memory`'s accounts), its prompts,
    and for the trained model its task and an fp32 copy for the reference logits."""
    model: torch.nn.Module
    shape: ModelShape
    prompts: Callable[[int, int], torch.Tensor]  # (batch, length) -> ids on the device
    task: object | None = None
    fp32: torch.nn.Module | None = None
    training: dict | None = None


def check_model(model_name: str, layers: int | None) -> None:
    """ValueError, one line, for a model (or --layers) the bench cannot take: said before any GPU work."""
    if model_name != TRAINED_MODEL:
        try:
            find_model(model_name)
        except ValueError as e:
            raise ValueError(f"{e} (or {TRAINED_MODEL}: the small model the bench trains)") from None
    elif layers:
        raise ValueError(f"--layers does not apply to --model {TRAINED_MODEL}: its layers are its recipe's")


def _subject(model_name: str, layers: int | None, dtype: str, device: str, seed: int,
             progress: Callable[[str], None] | None) -> _Subject:
    check_model(model_name, layers)
    if model_name != TRAINED_MODEL:
        shape = find_model(model_name)
        model = build_model(shape, layers, getattr(torch, dtype), device, seed)
        shape = replace(shape, layers=layers or shape.layers)

        def random_prompts(batch: int, length: int) -> torch.Tensor:
            gen = torch.Generator(device="cpu").manual_seed(seed + length)
            return torch.randint(0, shape.vocab, (batch, length), generator=gen).to(device)
        return _Subject(model, shape, random_prompts)

    from flashtune import hf  # noqa: F401  (registers the "ftune" attention)
    from flashtune.measure import recall_model
    from flashtune.paths import cache_dir

    recipe = RECALL_RECIPE or recall_model.Recipe()
    report = (lambda step, total, loss: progress(f"training the recall model: step {step}/{total}, loss {loss:.3f}")
              if progress and step % 100 == 0 else None)
    fp32, record = recall_model.load_or_train(recipe, device, cache_dir(), progress=report)
    model = recall_model.build(recipe, getattr(torch, dtype), attn_implementation="eager").to(device).eval()
    model.load_state_dict(fp32.state_dict())
    fp32.cpu()  # on the GPU only while it computes the reference logits (_fp32_logits)
    shape = ModelShape(TRAINED_MODEL, recipe.layers, recipe.hidden, recipe.heads, recipe.kv_heads, recipe.head_dim,
                       recipe.intermediate, recipe.task.vocab)

    def task_prompts(batch: int, length: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(recall_model.HELD_OUT_SEED + length)
        return recipe.task.sample(batch, length, gen)[0].to(device)
    training = {"recipe_key": recipe.key(), **asdict(record)}
    training["solves_task"] = all(v >= TASK_ACCURACY_BAR for v in record.accuracy.values())
    training["within_training_budget"] = record.seconds <= TRAINING_BUDGET_S
    return _Subject(model, shape, task_prompts, recipe.task, fp32, training)


def run_model_bench(model_name: str, backends: list[str], prefill: list[int], batch: int | list[int] = 1,
                    decode_steps: int = DEFAULT_DECODE_STEPS, layers: int | None = None, dtype: str = "bfloat16",
                    repeats: int = 3, device: str = "cuda", seed: int = 0,
                    checkpoint: Callable[[ModelBenchResult], None] | None = None,
                    progress: Callable[[str], None] | None = None, shares: bool | None = None) -> ModelBenchResult:
    """Per prefill length and backend: TTFT (a prefill that keeps the KV cache and computes the
    last position's logits, as serving does), its peak memory next to `flashtune memory`'s
    prediction, decode tokens/s (static cache and CUDA graph; generate), attention's share of the
    prefill and of a decode step, and consistency with the first backend (and, for the trained
    model, its task accuracy and agreement with fp32 math). `checkpoint` gets the result after
    each row (bench --out writes it: a long run keeps what it measured); a backend out of memory
    at a length is that row's status, and the run goes on; so is one that `flashtune memory` predicts
    to need more than the GPU has (not run). `batch`: one batch size or several, each
    length run at each (rows in that order, each compared with the first backend at its own batch).
    Every row's clocks run before any profiler session (profile_rows says why); TTFT is the median
    of `repeats` prefills after untimed ones (PREFILL_WARMUP_SECONDS), and generate is timed after an
    untimed one of the same length, both before the static-cache loop. `shares`: the attention-share columns, from the profiler (default: on a GPU)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    batches = [batch] if isinstance(batch, int) else list(batch)
    subject = _subject(model_name, layers, dtype, device, seed, progress)
    model, shape = subject.model, subject.shape
    cuda = device.startswith("cuda")
    capacity = device_memory(device)
    import transformers  # its version beside torch's: the model's attention and mask code are its

    header = {**environment(), "transformers": transformers.__version__} if cuda else None
    result = ModelBenchResult(header, model_name, shape.layers, dtype, decode_steps, training=subject.training)

    def measure(length: int, batch: int) -> None:
        """Every backend's row at one prefill length and batch size, compared with the first's."""
        ref = None
        ids = subject.prompts(batch, length)
        keep = consistency_positions(length, shape.vocab)
        fp32_logits, fp32_missing = None, None
        if subject.fp32 is not None:
            try:
                fp32_logits = _fp32_logits(subject, ids, keep)
            except torch.cuda.OutOfMemoryError:  # every backend's row still runs; each says what is missing
                fp32_missing = f"ok; no fp32 comparison: fp32 math out of memory at {length} tokens"
                if cuda:
                    torch.cuda.empty_cache()
        for name in backends:
            impl, sdpa_backend = MODEL_BACKENDS[name]
            row = ModelRow(name, length, batch)
            context = (lambda: sdpa_kernel([getattr(SDPBackend, sdpa_backend)])) if sdpa_backend else nullcontext
            predicted = accounts(shape, batch, length, dtype).total(flash=name not in NON_FLASH_BACKENDS)
            row.predicted_peak_mb = round(predicted / 2**20, 1)
            if predicted > capacity:  # it would run out of memory, maybe after minutes of the backends before it
                row.status = (f"not run: `flashtune memory` predicts {predicted / 2**30:.1f} GiB, more than the "
                              f"GPU's {capacity / 2**30:.1f} GiB")
                _add(result, row, checkpoint)
                continue
            try:
                model.set_attn_implementation(impl)
                if cuda:  # each row from the same memory: the cuBLAS workspaces earlier rows' streams left go
                    torch.cuda.synchronize()
                    torch._C._cuda_clearCublasWorkspaces()
                    torch.cuda.empty_cache()
                with context(), torch.no_grad():
                    def prefill():
                        return model(ids, use_cache=True, logits_to_keep=1).logits.argmax(-1)
                    # a backend's first calls at a shape (cuDNN's plan): no served prompt's
                    warm_up([prefill], seconds=PREFILL_WARMUP_SECONDS if cuda else 0.0)
                    if cuda:
                        torch.cuda.reset_peak_memory_stats()
                    ttfts = [_timed(prefill, device)[1] for _ in range(repeats)]
                    if cuda:  # the whole model's peak: weights + KV cache + one layer's transients
                        row.peak_mem_mb = round(torch.cuda.max_memory_allocated() / 2**20, 1)
                    row.ttft_ms = 1e3 * statistics.median(ttfts)
                    logits = model(ids, logits_to_keep=keep).logits  # for the consistency columns
                    # generate before the static-cache loop, whose CUDA graph capture may fail (eager's
                    # step on an H100): whatever a failed capture leaves behind cannot reach generate's row.
                    # Untimed first, at every cache length the timed call meets: a backend that plans per
                    # shape (SDPA's cuDNN) would otherwise pay each new length's plan in the first row only
                    def generate():
                        return model.generate(ids, max_new_tokens=decode_steps, min_new_tokens=decode_steps,
                                              do_sample=False)
                    generate()
                    host_seconds: list[float] = []
                    with _decode_attention_host_time(model, impl, host_seconds):
                        generated, gen_seconds = _timed(generate, device)
                    if host_seconds:
                        row.attention_host_us = 1e6 * statistics.median(host_seconds)
                    decode_seconds = gen_seconds - statistics.median(ttfts)
                    row.generate_tok_s = batch * (decode_steps - 1) / max(decode_seconds, 1e-9)
                    try:
                        tokens, step_seconds = static_decode(model, ids, decode_steps, graph=cuda)
                        row.decode_tok_s = batch / max(step_seconds, 1e-9)
                    except RuntimeError as e:  # a backend the harness cannot run: a forced SDPA backend
                        if name == "flashtune":  # that takes no mask (flash), which a static cache needs;
                            raise                # eager, whose step a CUDA graph could not capture on an H100
                        tokens = None
                        row.status = f"ok; no static-cache decode: {str(e).splitlines()[0][:160]}"
            except torch.cuda.OutOfMemoryError as e:  # this length does not fit this backend
                row.status = f"out of memory: {str(e).splitlines()[0][:200]}"
                _add(result, row, checkpoint, free=cuda)
                continue
            except (RuntimeError, ValueError, ImportError) as e:  # a backend that refuses this model or shape,
            # or is not installed (flash-attn2 without flash_attn)
                row.status = f"unavailable: {str(e).splitlines()[0][:200]}"
                _add(result, row, checkpoint, free=cuda)
                continue
            if tokens is None:  # the row's greedy tokens are generate's
                tokens = generated[:, length:]
            elif not torch.equal(generated[:, length:], tokens):  # two decode loops, one greedy answer
                row.status = "ok; generate and the static-cache loop chose different tokens"
            if ref is None:  # the first backend that ran at this length and batch
                ref = (name, logits.cpu(), tokens)
            row.vs = ref[0]
            try:
                row.max_abs_logit_diff, row.top1_agreement = _consistency(logits, ref[1], device)
                if fp32_logits is not None:
                    row.fp32_max_abs_logit_diff, row.fp32_top1_agreement = _consistency(logits, fp32_logits, device)
                    row.recall_accuracy = _recall_accuracy(logits, ids, subject.task, keep)
            except torch.cuda.OutOfMemoryError:  # the timings stand; the comparison says why it is missing
                row.status = "ok; consistency not computed: out of memory comparing the logits"
                torch.cuda.empty_cache()
            row.greedy_identical = (tokens == ref[2]).all(dim=1).tolist()
            if fp32_missing and row.status == "ok":
                row.status = fp32_missing
            del logits
            _add(result, row, checkpoint)

    def profile_rows() -> None:
        """Attention's share of each timed row's prefill and decode step, from the profiler. Last,
        after every clock above: a profiler session leaves CUPTI attached to the process (kineto
        detaches it only with TEARDOWN_CUPTI=1, which on an H100 did not help), and its callbacks
        then cost every kernel launch time. A 32-layer model's 1k-token prefill is launch-bound: on
        an H100, with the profiling inside each row, the backend timed first took 32.6 ms and the
        three after it 68-74 ms."""
        for row in result.rows:
            if not row.status.startswith("ok"):
                continue
            impl, sdpa_backend = MODEL_BACKENDS[row.backend]
            context = (lambda: sdpa_kernel([getattr(SDPBackend, sdpa_backend)])) if sdpa_backend else nullcontext
            ids = subject.prompts(row.batch, row.prefill)
            try:
                model.set_attn_implementation(impl)
                with context(), torch.no_grad():
                    row.attention_share = _attention_share(model, ids, row.backend)
                    if row.decode_tok_s is not None:  # a backend with a static-cache decode
                        attention, total = decode_step_kernel_times(model, ids, row.backend)
                        row.decode_attention_share = attention / total if total else None
                        kv_bytes = accounts(shape, row.batch, row.prefill, dtype).kv_cache
                        row.decode_attention_gbps = kv_bytes / attention / 1e9 if attention else None
            except torch.cuda.OutOfMemoryError:  # the timings stand; the shares say why they are missing
                row.status += "; attention shares not measured: out of memory"
                torch.cuda.empty_cache()
            if checkpoint:
                checkpoint(result)

    for length in prefill:
        for batch in batches:
            measure(length, batch)
    if cuda if shares is None else shares:
        profile_rows()
    return result


def device_memory(device: str) -> float:
    """The bytes a row may predict to need before it is left out: the GPU's memory (no limit on the CPU)."""
    return torch.cuda.get_device_properties(device).total_memory if device.startswith("cuda") else float("inf")


def _fp32_logits(subject: _Subject, ids: torch.Tensor, keep: int) -> torch.Tensor:
    """The trained model's logits in fp32 with SDPA's math kernel (on the CPU, for the comparison).
    The fp32 copy waits on the CPU between these calls, so the backends' peaks hold only their model."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    subject.fp32.to(ids.device)
    try:
        with sdpa_kernel([SDPBackend.MATH]), torch.no_grad():
            return torch.cat([subject.fp32(ids[i:i + 1], logits_to_keep=keep).logits.cpu()
                              for i in range(ids.shape[0])])
    finally:
        subject.fp32.cpu()
        if ids.is_cuda:
            torch.cuda.empty_cache()


def _recall_accuracy(logits: torch.Tensor, ids: torch.Tensor, task, keep: int) -> float:
    """Top-1 on the recall positions among the last `keep` positions (each predicts the next token)."""
    from flashtune.measure.recall_model import recall_positions

    recall = recall_positions(ids.cpu(), task)[:, -keep + 1:] if keep > 1 else None
    if recall is None or not recall.any():
        return float("nan")
    predicted = logits[:, :-1].argmax(-1).cpu()
    return ((predicted == ids[:, -keep + 1:].cpu()) & recall).sum().item() / recall.sum().item()


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
    """`bench --model`: TTFT, decode tokens/s and peak memory against prefill length per backend (and
    batch size, where the run had several)."""
    plt = pyplot()
    panels = (("ttft_ms", "time to first token (ms)"), ("decode_tok_s", "decode tokens/s"),
              ("peak_mem_mb", "prefill peak memory (MB)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    lines = list(dict.fromkeys((r.backend, r.batch) for r in result.rows))
    several = len({batch for _, batch in lines}) > 1
    for ax, (key, label) in zip(axes.flat, panels):
        for backend, batch in lines:
            points = sorted((r.prefill, getattr(r, key)) for r in result.rows
                            if (r.backend, r.batch) == (backend, batch) and getattr(r, key) is not None)
            style = dict(linewidth=2.5, marker="o") if backend == "flashtune" else dict(marker=".")
            ax.plot([p[0] for p in points], [p[1] for p in points],
                    label=f"{backend}, batch {batch}" if several else backend, **style)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("prefill length")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(f"flashtune bench --model {result.model} ({result.layers} layers, {result.dtype})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


TASK_ACCURACY_BAR = 0.95  # issue 34: a model that solves its task has confident logits to compare
TRAINING_BUDGET_S = 120  # issue 34: the bench's own model trains in at most two minutes on the GPU


def render(result: ModelBenchResult, console: Console) -> None:
    """`bench --model`: one line per (prefill length, batch, backend); the trained model's columns
    (task accuracy, agreement with fp32 math) only when it ran."""
    trained = any(r.recall_accuracy is not None for r in result.rows)
    title = (f"flashtune bench --model {result.model} ({result.layers} layers, {result.dtype}, "
             f"{result.decode_steps} decode steps)")
    if result.training:
        accuracy = ", ".join(f"{k}: {v:.1%}" for k, v in result.training["accuracy"].items())
        title += f"; trained {result.training['seconds']:.0f} s, held-out recall accuracy {accuracy}"
    table = Table(title=title)
    columns = [  # (heading, row field, format)
        ("TTFT ms", "ttft_ms", ".1f"), ("decode tok/s", "decode_tok_s", ".0f"),
        ("generate tok/s", "generate_tok_s", ".0f"), ("peak MB", "peak_mem_mb", ".0f"),
        ("predicted MB", "predicted_peak_mb", ".0f"), ("attn share prefill", "attention_share", ".0%"),
        ("attn share decode", "decode_attention_share", ".0%"), ("decode attn GB/s", "decode_attention_gbps", ".0f"),
        ("attn host us", "attention_host_us", ".0f"), ("max |dlogit|", "max_abs_logit_diff", ".3g"),
        ("top-1 agree", "top1_agreement", ".2%")]
    if trained:
        columns += [("recall acc", "recall_accuracy", ".2%"), ("top-1 vs fp32", "fp32_top1_agreement", ".2%"),
                    ("max |dlogit| fp32", "fp32_max_abs_logit_diff", ".3g")]
    for heading in ("prefill", "batch", "backend", *(c[0] for c in columns), "vs", "greedy same", "status"):
        table.add_column(heading, justify="left" if heading in ("backend", "vs", "status") else "right",
                         overflow="fold")

    def num(row, key, fmt):
        return format(getattr(row, key), fmt) if getattr(row, key) is not None else "-"

    for r in result.rows:
        greedy = r.greedy_identical
        table.add_row(str(r.prefill), str(r.batch), r.backend, *(num(r, key, fmt) for _, key, fmt in columns),
                      r.vs or "-",
                      f"{sum(greedy)}/{len(greedy)}" if greedy else "-",
                      r.status if r.status == "ok" else f"[yellow]{r.status}[/]")
    console.print(table)
    if result.training and not result.training.get("solves_task", True):
        console.print(f"[yellow]the trained model is below {TASK_ACCURACY_BAR:.0%} held-out recall accuracy at some "
                      "prompt lengths: its logits are less confident there, and the consistency columns say less[/]")
    if result.training and not result.training.get("within_training_budget", True):
        console.print(f"[yellow]the recall model's training took {result.training['seconds']:.0f} s on "
                      f"{result.training['device']}, over its {TRAINING_BUDGET_S} s budget: its recipe "
                      "(flashtune/measure/recall_model.py) is too large for this GPU[/]")
