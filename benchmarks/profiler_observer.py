"""The profiler's observer effect on the reference workload: one rank, unprofiled vs recorded steps.

Each variant runs in its own child process (one pp=1 rank of the reference GPT, gloo world of 1, one
torch thread): 2 warm-up steps, ``--steps`` unprofiled steps, then ``--steps`` steps under
``torch.profiler`` (CPU, ``record_shapes=True``), and prints per step: CPU seconds, minor page faults
and resident memory gained, plus the median traced duration of a few operators next to an
unprofiled loop of ``aten::gelu_backward`` at the workload's shape. Variants alternate ``--rounds``
times in one run, so a change of machine load hits both alike. Usage::

    python benchmarks/profiler_observer.py [--rounds 2] [--steps 6] [--variants lists,no-lists]

Variants: ``lists`` (torch's default: scalar lists recorded in Concrete Inputs), ``no-lists`` (what
the workload does on CPU, ``train.records_scalar_lists``), ``no-shapes`` (``record_shapes=False``, for
reference: decode needs shapes). ``GLIBC_TUNABLES`` is passed to the children as set.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from statistics import median

OPS = ("aten::mm", "aten::gelu", "aten::gelu_backward", "aten::add", "aten::lerp_")
VARIANTS = ("lists", "no-lists", "no-shapes")


def child(variant: str, steps: int) -> dict[str, object]:
    """Run in the child: the measurements of one variant."""
    import resource
    import time

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    import torch
    import torch.distributed as dist
    from torch.autograd.profiler import record_function

    from tracecal.workload.config import WorkloadConfig
    from tracecal.workload.launch import free_port
    from tracecal.workload.model import GPTStage, micro_batches
    from tracecal.workload.parallel import init_parallel
    from tracecal.workload.schedule import run_1f1b
    from tracecal.workload.train import OPTIMIZER, record_scalar_lists

    os.environ["MASTER_PORT"] = str(free_port())
    torch.set_num_threads(1)
    cfg = WorkloadConfig(pp=1, steps=steps)
    state = init_parallel(cfg)
    stage = GPTStage(cfg, state)
    optimizer = torch.optim.AdamW([p for p in stage.parameters() if p.requires_grad], lr=cfg.lr)
    data = [micro_batches(cfg, 0, s) for s in range(steps)]

    def resident_mb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    def step(s: int) -> list[float]:
        r0, c0, m0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time(), resident_mb()
        optimizer.zero_grad(set_to_none=False)
        run_1f1b(stage, state, data[s % steps], None)
        with record_function(OPTIMIZER):
            optimizer.step()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0
        return [1e3 * (time.process_time() - c0), faults, resident_mb() - m0]

    for s in range(2):
        step(s)
    plain = [step(s) for s in range(steps)]
    record_scalar_lists(variant == "lists")
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=variant != "no-shapes"
    ) as prof:
        recorded = []
        for s in range(steps):
            recorded.append(step(s))
            prof.step()
    traced: dict[str, list[float]] = {op: [] for op in OPS}
    for e in prof.events():
        if e.name in traced:
            traced[e.name].append(e.cpu_time_total)
    x, g = torch.randn(256, 1024), torch.randn(256, 1024)
    loop = []
    for i in range(53):
        t = time.perf_counter()
        torch.ops.aten.gelu_backward(g, x)
        if i >= 3:
            loop.append(1e6 * (time.perf_counter() - t))
    dist.destroy_process_group()
    return {
        "plain": plain,
        "recorded": recorded,
        "traced_us": {op: median(v) for op, v in traced.items() if v},
        "loop_gelu_backward_us": median(loop),
    }


def _range(values: list[float], fmt: str = "{:.0f}") -> str:
    return f"{fmt.format(min(values))}–{fmt.format(max(values))}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--variants", default="lists,no-lists")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps)))
        return
    variants = args.variants.split(",")
    for v in variants:
        if v not in VARIANTS:
            parser.error(f"unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
    print(f"load {os.getloadavg()[0]:.1f}; GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r}")
    head = ["variant", "round", "CPU ms/step plain", "recorded", "faults plain", "recorded", "MB kept/rec. step"]
    head += [op.split("::")[1] + " µs" for op in OPS] + ["gelu_bwd loop µs"]
    print(" | ".join(head))
    for r in range(args.rounds):
        for v in variants:
            out = subprocess.run(
                [sys.executable, __file__, "--child", v, "--steps", str(args.steps)],
                capture_output=True,
                text=True,
                check=True,
            )
            m = json.loads(out.stdout.strip().splitlines()[-1])
            plain, rec = m["plain"], m["recorded"]
            row = [v, str(r + 1), _range([p[0] for p in plain]), _range([p[0] for p in rec])]
            row += [_range([p[1] for p in plain]), _range([p[1] for p in rec]), _range([p[2] for p in rec])]
            row += [f"{m['traced_us'].get(op, float('nan')):.0f}" for op in OPS]
            row += [f"{m['loop_gelu_backward_us']:.0f}"]
            print(" | ".join(row), flush=True)


if __name__ == "__main__":
    main()
