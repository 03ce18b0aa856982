"""One call each of flashtune and SDPA's cuDNN backend on chosen cells, inside a profiler range, for
Nsight Compute: how each backend launches (grid, block, registers, shared memory, cluster, CTAs per
SM) and where its time goes (SM, tensor, DRAM throughput, warp stalls). A cell is an FA-grid prefill
cell, HDIM:CAUSAL:SEQLEN (batch and heads as the grid's), its backward, bwd:HDIM:CAUSAL:SEQLEN (the
gradients of one kept forward, as `bench --pass bwd` times them), or a `bench --decode` cell,
decode:HDIM:HEADS_KV:BATCH:CACHE (32 query heads, one query token, contiguous cache).
NCU_BACKENDS=flashtune,sdpa-flash: other backends than flashtune and sdpa-cudnn (prefill and backward cells).

Run: ncu --clock-control none --profile-from-start off --section LaunchStats --section Occupancy \
       --section SpeedOfLight python3 lab/ncu_cells.py PROFILE CELL...
e.g. ... lab/ncu_cells.py h200 64:1:512 256:1:512 decode:128:1:1:1024
(--clock-control none leaves the clocks to the GPU, so a kernel after a pause may run at idle
clocks: compare launches and stalls more than durations.)
"""
import os
import sys

import torch

from flashtune.measure.backends import BACKENDS, Inputs
from flashtune.measure.decode_backends import DECODE_BACKENDS
from flashtune.measure.decode_problem import DecodeProblem, make_decode_inputs
from flashtune.measure.problem import fa_grid, make_inputs
from flashtune.commands.bench import with_gradients
from flashtune.runtime import ops

NAMES = os.environ.get("NCU_BACKENDS", "flashtune,sdpa-cudnn").split(",")


def runners(cell: str):
    """name -> one call of that backend on the cell (built, loaded and run once)."""
    if cell.startswith("decode:"):
        hdim, heads_kv, batch, cache = (int(x) for x in cell.split(":")[1:])
        inputs = make_decode_inputs(DecodeProblem("bfloat16", hdim, 32, heads_kv, batch, cache, 1), seed=0)
        return {name: DECODE_BACKENDS[name](inputs, False, hdim ** -0.5) for name in ("flashtune", "sdpa-cudnn")}
    backward = cell.startswith("bwd:")
    hdim, causal, seqlen = (int(x) for x in cell.removeprefix("bwd:").split(":"))
    (shape,) = fa_grid(seqlens=[seqlen], hdims=[hdim], causal=[bool(causal)])  # the bench's batch and heads
    q, k, v = (t.requires_grad_(backward) for t in make_inputs(shape, seed=0))
    case = Inputs(q, k, v, bool(causal), hdim ** -0.5)
    if backward:
        dout = torch.randn_like(q)
        return {name: with_gradients(BACKENDS[name], "bwd", dout)(case) for name in NAMES}
    return {name: BACKENDS[name](case) for name in NAMES}


ops.use_profile(sys.argv[1])
for cell in sys.argv[2:]:
    for name, run in runners(cell).items():
        for _ in range(3):
            run()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        run()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        print(f"profiled {name} {cell}", flush=True)
