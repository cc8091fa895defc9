"""One `cli grid` run with its own account: where the wall time went and the head matmuls it did (the child process
of bench/speed/grid_stsb.py, run on whichever checkout is first on PYTHONPATH: before and after a change).

    python bench/speed/grid_account.py --store S --data D --grid G --out DIR --account ACCOUNT.json

Timers wrap the grid's parts from outside (no code of the grid changes): each second goes to the innermost part
running (exclusive times), the rest of the wall is Python / other. FLOPs are counted where the heads run: every
forward of a StackedMLP adds 2 n sum(i o) per head to the part running it (n rows, layers i -> o); a forward with
gradients (a training step) adds its backward too, 2 n sum(i o) for the weights + 2 n sum_{l >= 2} i o for the
inputs (the features need none). The optimiser's elementwise work is counted apart (~12 FLOPs and 28 bytes per
parameter updated). The GEMMs' shapes (H, m, k, n) are collected with their counts.
"""
from __future__ import annotations

import argparse
import collections
import importlib
import json
import resource
import time
from pathlib import Path

import torch

STACK = []  # [part, start, child seconds] of the parts running, innermost last
SECONDS: dict[str, float] = collections.defaultdict(float)
FLOPS: dict[str, float] = collections.defaultdict(float)
GEMMS: collections.Counter = collections.Counter()
STACKS: list[dict] = []
STEP_TIMES: list[float] = []  # seconds of each training step of the current stack (forward to update)


def timed(part: str, fn):
    """fn, its time charged to `part` less the time of the parts it calls."""
    def wrapper(*args, **kwargs):
        STACK.append([part, time.perf_counter(), 0.0])
        try:
            return fn(*args, **kwargs)
        finally:
            _, t0, child = STACK.pop()
            elapsed = time.perf_counter() - t0
            SECONDS[part] += elapsed - child
            if STACK:
                STACK[-1][2] += elapsed
    return wrapper


def patch(obj, name: str, part: str) -> None:
    if hasattr(obj, name):
        setattr(obj, name, timed(part, getattr(obj, name)))


def layer_sizes(model) -> list[tuple[int, int]]:
    dims = model.cfg.layer_dims()
    return list(zip(dims[:-1], dims[1:]))


def count_forward(forward):
    """StackedMLP.forward counting its matmuls (and a training forward's backward) where it runs."""
    def wrapper(self, x):
        H, n = self.n_heads, x.shape[-2]
        sizes = layer_sizes(self)
        part = STACK[-1][0] if STACK else "other"
        FLOPS[part] += H * n * 2 * sum(i * o for i, o in sizes)
        if torch.is_grad_enabled() and self.training:
            FLOPS["backward"] += H * n * (2 * sum(i * o for i, o in sizes) + 2 * sum(i * o for i, o in sizes[1:]))
            if torch.is_autocast_enabled(x.device.type):  # each weight cast to bf16 (4 B read, 2 written), its
                FLOPS["cast bytes"] += 12 * H * sum(i * o + o for i, o in sizes)  # gradient back (2 read, 4 written)
            for l, (i, o) in enumerate(sizes):
                GEMMS[("forward", H, n, i, o)] += 1
                GEMMS[("backward dW", H, i, n, o)] += 1
                if l:
                    GEMMS[("backward dX", H, n, o, i)] += 1
        elif sizes:
            GEMMS[(part, H, n, sizes[0][0], sizes[0][1])] += 1
        return forward(self, x)
    return wrapper


def count_update(step):
    def wrapper(self, *args, heads=None, **kwargs):
        params = sum(p.numel() for g in self.param_groups for p in g["params"])
        H = self.param_groups[0]["params"][0].shape[0] if params else 1
        share = 1.0 if heads is None else float(heads.sum()) / H
        FLOPS["optimizer (elementwise)"] += 12 * params * share
        FLOPS["optimizer bytes"] += 28 * params * share
        return step(self, *args, **kwargs) if heads is None else step(self, *args, heads=heads, **kwargs)
    return wrapper


def stack_timer(train):
    """StackRunner.train timed per stack: seconds, steps, first step against the median step."""
    def wrapper(self, items, array, progress):
        STEP_TIMES.clear()
        t0 = time.perf_counter()
        rows = train(self, items, array, progress)
        cfg, head = items[0][2], items[0][1]
        steps = sorted(STEP_TIMES)
        STACKS.append({"loss": cfg.loss, "depth": head.depth, "heads": len(items), "precision": cfg.precision,
                       "seconds": time.perf_counter() - t0, "steps": len(steps),
                       "first_step_s": STEP_TIMES[0] if STEP_TIMES else 0.0,
                       "median_step_s": steps[len(steps) // 2] if steps else 0.0})
        return rows
    return wrapper


def step_timer(epoch_batches):
    """Each step's seconds: the time between two batches drawn (the step in between)."""
    def wrapper(self):
        last = time.perf_counter()
        for batch in epoch_batches(self):
            yield batch
            now = time.perf_counter()
            STEP_TIMES.append(now - last)
            last = now
    return wrapper


def install() -> dict:
    """The timers and counters on the grid's parts; the plan's modelled seconds land in the returned dict."""
    from headstore.heads.experiments.grid import run as grid, stack as grid_stack
    from headstore.heads.network.model import StackedMLP
    from headstore.heads.training import optim, stacked_adamw, tracker, train

    plan: dict = {}
    modelled = grid.plan_seconds

    def plan_seconds(*args, **kwargs):
        plan["modelled"] = modelled(*args, **kwargs)
        return plan["modelled"]

    grid.plan_seconds = plan_seconds
    StackedMLP.forward = count_forward(StackedMLP.forward)
    stacked_adamw.StackedAdamW.step = count_update(stacked_adamw.StackedAdamW.step)
    grid_stack.StackRunner.train = stack_timer(grid_stack.StackRunner.train)
    train.StackTraining.epoch_batches = step_timer(train.StackTraining.epoch_batches)
    for obj, name, part in [
            (grid, "load_inputs", "read inputs"), (grid, "write_results", "write results"),
            (grid, "_finish", "leaderboard, summary, plots"), (grid_stack.StackRunner, "ensure_baseline", "baseline"),
            (grid_stack.StackRunner, "score", "final scoring"), (grid_stack.StackRunner, "save", "write results"),
            (train.StackTraining, "__init__", "stack set-up"), (train.StackTraining, "epoch_negatives", "negatives"),
            (train, "make_batch", "batches"),
            (train, "batch_losses", "forward + loss"), (optim.StackOptimizer, "step", "backward + clipping"),
            (stacked_adamw.StackedAdamW, "step", "optimizer"), (train, "dev_scores", "dev scoring"),
            (tracker.HeadTracker, "end_epoch", "tracker (best weights)"), (train.StackTraining, "finish", "finish")]:
        patch(obj, name, part)
    return plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in ("--store", "--data", "--grid", "--out", "--account"):
        ap.add_argument(name, required=True)
    args = ap.parse_args()
    # the command line's process settings for `cli grid` (headstore.cli; the parent sets THP_MEM_ALLOC_ENABLE as it
    # does): glibc's malloc keeping freed memory, where the checkout run has it
    process = importlib.import_module("headstore.data.process")
    malloc_kept = getattr(process, "keep_freed_memory", lambda: False)()
    t0 = time.perf_counter()
    from headstore.heads.experiments.grid.run import run_grid

    import_s = time.perf_counter() - t0
    plan = install()
    t1, cpu0 = time.perf_counter(), time.process_time()
    run_grid(args.store, args.data, args.grid, args.out, progress=False, overwrite=True)
    wall = time.perf_counter() - t1
    seconds = {**SECONDS, "Python / other": wall - sum(SECONDS.values())}
    usage = resource.getrusage(resource.RUSAGE_SELF)
    Path(args.account).write_text(json.dumps({
        "wall_s": wall, "cpu_s": time.process_time() - cpu0, "import_s": import_s, "seconds": seconds,
        "flops": dict(FLOPS), "gemms": [[*k, v] for k, v in GEMMS.most_common()], "stacks": STACKS,
        "modelled_s": plan.get("modelled", []), "max_rss_mb": usage.ru_maxrss / 1024,
        "torch_threads": torch.get_num_threads(), "malloc_kept": malloc_kept, "headstore": __import__("headstore").__file__}, indent=1))


if __name__ == "__main__":
    main()
