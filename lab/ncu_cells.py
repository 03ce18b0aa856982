"""One call each of flashtune and SDPA's cuDNN backend on chosen FA-grid cells, inside a
profiler range, for Nsight Compute: how each backend launches (grid, block, registers, shared
memory, CTAs per SM) and where its time goes (SM, tensor, DRAM throughput).

Run: ncu --clock-control none --profile-from-start off --section LaunchStats --section Occupancy \
       --section SpeedOfLight python3 lab/ncu_cells.py PROFILE HDIM:CAUSAL:SEQLEN...
e.g. ... lab/ncu_cells.py h200 64:1:512 256:1:512   (CAUSAL 0 or 1; batch and heads as the FA grid)
"""
import sys

import torch

from flashtune.runtime import ops
from flashtune.measure.backends import BACKENDS, Inputs
from flashtune.measure.problem import fa_grid, make_inputs

ops.use_profile(sys.argv[1])
for cell in sys.argv[2:]:
    hdim, causal, seqlen = (int(x) for x in cell.split(":"))
    (shape,) = fa_grid(seqlens=[seqlen], hdims=[hdim], causal=[bool(causal)])  # the bench's batch and heads
    q, k, v = make_inputs(shape, seed=0)
    case = Inputs(q, k, v, bool(causal), hdim ** -0.5)
    for name in ("flashtune", "sdpa-cudnn"):
        run = BACKENDS[name](case)  # builds, loads and runs it once
        run()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        run()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        print(f"profiled {name} {cell}", flush=True)
