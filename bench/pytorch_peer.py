"""PyTorch peer for bench/compare_pytorch.py and bench/train_throughput.sh: trains tools/reference/models.py's UNet16 on CPU
exactly as dptrain does (fp32, NCHW, BCEWithLogits, SGD momentum 0.9, weight decay 1e-4), one
process or --world N processes with DistributedDataParallel over gloo (N x --threads threads).

    python bench/pytorch_peer.py --world 1 --threads 2 --divisor 8 --size 128 --batch 8

Data are random tensors made once (no loader). Prints one JSON line: the median step time of the
timed steps (after --warmup), img/s over all ranks, and the summed peak RSS of the processes.
"""
import argparse
import json
import os
import resource
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools",
                                "reference"))
from models import UNet16  # noqa: E402  (the reference model, dptrain's parameter names)


def peak_rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker(rank, args, init_file, results):
    torch.set_num_threads(args.threads)
    if args.pin:
        os.sched_setaffinity(0, {rank % os.cpu_count()})
    torch.manual_seed(args.seed)
    model = UNet16(width_divisor=args.divisor)
    if args.world > 1:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=args.world)
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    loss_fn = nn.BCEWithLogitsLoss()
    g = torch.Generator().manual_seed(args.seed + rank)
    x = torch.randn(args.batch, 3, args.size, args.size, generator=g)
    y = (torch.rand(args.batch, 1, args.size, args.size, generator=g) < 0.1).float()
    times = []
    for i in range(args.warmup + args.steps):
        if args.world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    results[rank] = (sorted(times)[len(times) // 2], peak_rss_bytes())
    if args.world > 1:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--divisor", type=int, default=8)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8, help="per process")
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pin", action="store_true", help="pin process r to core r")
    args = ap.parse_args()
    if args.world == 1:
        results = {}
        worker(0, args, None, results)
    else:
        with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
            results = manager.dict()
            mp.spawn(worker, args=(args, os.path.join(tmp, "init"), results), nprocs=args.world)
            results = dict(results)
    step = max(t for t, _ in results.values())  # the slowest rank sets the pace
    print(json.dumps({"torch": torch.__version__, "step_seconds": step,
                      "img_per_s": args.batch * args.world / step,
                      "peak_rss_bytes": sum(r for _, r in results.values())}))


if __name__ == "__main__":
    main()
