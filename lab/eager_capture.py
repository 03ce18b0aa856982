"""Why bench --model's eager row ends "unavailable" (device, a minute): on a 2-layer llama of the
bench's shape, static_decode's CUDA-graph capture fails (a CPU->CUDA copy in eager's mask), and then
model.generate, which captures nothing, fails with the same capture message. This prints each
failure's whole traceback and, after the capture, whether the current stream is still capturing
and is still the capture stream, then whether generate runs when the capture is never tried.
Usage: PYTHONPATH=. python3 lab/eager_capture.py"""
import traceback

import torch

from flashtune.commands import bench_model
from flashtune.commands.memory import MODELS


def state(label: str) -> None:
    stream = torch.cuda.current_stream()
    print(f"-- {label}: capturing={torch.cuda.is_current_stream_capturing()} "
          f"current stream is default={stream == torch.cuda.default_stream()} ({stream})", flush=True)


def attempt(label: str, fn) -> None:
    try:
        fn()
        print(f"-- {label}: ok", flush=True)
    except Exception:  # noqa: BLE001  (the point is the traceback)
        print(f"-- {label}: failed", flush=True)
        traceback.print_exc()
    state(f"after {label}")


def main() -> None:
    shape = MODELS["llama3-8b-like"]
    model = bench_model.build_model(shape, 2, torch.bfloat16, "cuda")
    ids = torch.randint(0, shape.vocab, (1, 1024), device="cuda")
    generate = lambda: model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)  # noqa: E731
    with torch.no_grad():
        state("start")
        attempt("generate before any capture", generate)
        attempt("static_decode with a graph", lambda: bench_model.static_decode(model, ids, 8, graph=True))
        attempt("generate after the capture", generate)
        attempt("static_decode without a graph", lambda: bench_model.static_decode(model, ids, 8, graph=False))


if __name__ == "__main__":
    main()
