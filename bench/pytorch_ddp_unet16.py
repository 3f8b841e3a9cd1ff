"""PyTorch peer for dptrain's throughput benchmark: UNet16 (tools/reference/models.py) trained with
DistributedDataParallel over gloo, N processes x 1 thread, same size, width and per-rank batch.

    /usr/bin/python3 bench/pytorch_ddp_unet16.py --world 2 --size 128 --batch 8 --divisor 8

Data are random tensors made once per process (no loader): the loop is forward, BCEWithLogits,
backward (DDP's bucketed all-reduce, 25 MiB buckets, overlapping backward), SGD step. Prints
images/s over all ranks after warm-up steps; --world 1 runs the plain model without DDP.
"""
import argparse
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "reference"))
from models import UNet16  # noqa: E402  (the reference model, dptrain's parameter names)


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

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    if args.world > 1:
        dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    if args.world > 1:
        dist.barrier()
    seconds = time.perf_counter() - t0
    results[rank] = seconds
    if args.world > 1:
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--batch", type=int, default=8, help="images per rank per step")
    p.add_argument("--divisor", type=int, default=8, help="width divisor, as dptrain's")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--pin", action="store_true", help="pin process r to core r")
    args = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        results = mp.Manager().dict()
        init_file = os.path.join(tmp, "init")
        mp.spawn(worker, args=(args, init_file, results), nprocs=args.world, join=True)
        seconds = max(results.values())
    images = args.world * args.batch * args.steps
    print(f"pytorch {torch.__version__} {'DDP gloo' if args.world > 1 else 'single process'}: "
          f"{args.world} x {args.threads} thread(s), unet16 /{args.divisor}, "
          f"{args.size}x{args.size}, batch {args.batch} per rank: "
          f"{images / seconds:.2f} img/s ({args.steps} steps in {seconds:.1f} s)")


if __name__ == "__main__":
    main()
