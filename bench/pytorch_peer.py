"""PyTorch peer of dptrain's benchmarks: trains a reference model as dptrain does, on CPUs or a GPU.

Used by bench/compare_pytorch.py, bench/train_throughput.sh (CPU) and bench/compare_gpu.sh (GPU).
tools/reference/models.py's model (UNet16 by default) trained as dptrain trains it (BCEWithLogits,
SGD momentum 0.9, weight decay 1e-4). On the CPU (default): fp32, NCHW, one process or --world N
processes with DistributedDataParallel over gloo (N x --threads threads). With --device cuda: one
process on one GPU, channels_last, cudnn.benchmark, TF32 allowed for fp32 (as dptrain's default
BackendOptions::tf32); every step ends with a synchronize. --precision bf16: torch.autocast to
bfloat16 on either device (dptrain's --precision bf16 rounds the same convolution operands).

    python bench/pytorch_peer.py --world 1 --threads 2 --divisor 8 --size 128 --batch 8
    python bench/pytorch_peer.py --device cuda --divisor 1 --size 448 --batch 16 --steps 20

--size is S (square) or HxW. Data are random tensors made once (no loader). Prints one JSON line:
the median step time of the timed steps (after --warmup), img/s over all ranks, the summed peak
RSS of the processes, a training step's convolution FLOPs per image (train_flop_per_image: 3 x the
forward convolutions' 2 x multiply-adds, for the forward, data-gradient and weight-gradient
passes) and, on a GPU, the peak device memory PyTorch allocated.
"""
import argparse
import contextlib
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
import models  # noqa: E402  (the reference models, dptrain's parameter names)


def peak_rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def parse_size(text):
    """(H, W) from "S" or "HxW"."""
    h, _, w = text.partition("x")
    return int(h), int(w or h)


def train_flop_per_image(model, height, width):
    """3 x 2 x the multiply-adds of one image's forward convolutions (forward, data gradient and
    weight gradient passes of the same size): the FLOP count both sides' TFLOP/s divide by."""
    macs = []

    def hook(m, inp, out):
        k = m.kernel_size[0] * m.kernel_size[1] // m.groups
        if isinstance(m, nn.ConvTranspose2d):
            macs.append(inp[0].numel() * m.out_channels * k)
        else:
            macs.append(out.numel() * m.in_channels * k)

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d))]
    with torch.no_grad():
        model.eval()(torch.zeros(1, 3, height, width))
    model.train()
    for h in handles:
        h.remove()
    return 3 * 2 * sum(macs)


def worker(rank, args, init_file, results):
    torch.set_num_threads(args.threads)
    if args.pin:
        os.sched_setaffinity(0, {rank % os.cpu_count()})
    torch.manual_seed(args.seed)
    cuda = args.device == "cuda"
    if cuda:
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.allow_tf32 = True  # fp32 convolutions may use TF32, as dptrain's
        torch.backends.cuda.matmul.allow_tf32 = True
    device = torch.device(args.device)
    layout = torch.channels_last if cuda else torch.contiguous_format
    model = models.make(args.model, width_divisor=args.divisor, is_deconv=args.deconv)
    height, width = parse_size(args.size)
    flop = train_flop_per_image(model, height, width)
    model = model.to(device, memory_format=layout)
    if args.world > 1:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=args.world)
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    loss_fn = nn.BCEWithLogitsLoss()
    g = torch.Generator().manual_seed(args.seed + rank)
    x = torch.randn(args.batch, 3, height, width, generator=g)
    y = (torch.rand(args.batch, 1, height, width, generator=g) < 0.1).float()
    x, y = x.to(device).contiguous(memory_format=layout), y.to(device)
    bf16 = args.precision == "bf16"
    times = []
    for i in range(args.warmup + args.steps):
        if args.world > 1:
            dist.barrier()
        if cuda:
            torch.cuda.synchronize()
        profiled = cuda and args.profile and i == args.warmup + args.steps - 1
        if profiled:
            torch.cuda.profiler.start()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(args.device, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        if profiled:
            torch.cuda.profiler.stop()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    peak_device = torch.cuda.max_memory_allocated() if cuda else 0
    results[rank] = (sorted(times)[len(times) // 2], peak_rss_bytes(), peak_device, flop)
    if args.world > 1:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--divisor", type=int, default=8)
    ap.add_argument("--size", default="128", help="S (square) or HxW")
    ap.add_argument("--batch", type=int, default=8, help="per process")
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pin", action="store_true", help="pin process r to core r")
    ap.add_argument("--profile", action="store_true",
                    help="cuda: cudaProfilerStart/Stop around the last step (ncu --profile-from-start off)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--model", choices=["unet16", "unet_resnet34", "unet_resnet101"],
                    default="unet16")
    ap.add_argument("--deconv", action="store_true", help="transposed-convolution decoder")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: torch.autocast (CPU or GPU)")
    args = ap.parse_args()
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("pytorch_peer: --device cuda, but this PyTorch sees no GPU")
        if args.world != 1:
            raise SystemExit("pytorch_peer: --device cuda runs one process (--world 1)")
    if args.world == 1:
        results = {}
        worker(0, args, None, results)
    else:
        with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
            results = manager.dict()
            mp.spawn(worker, args=(args, os.path.join(tmp, "init"), results), nprocs=args.world)
            results = dict(results)
    step = max(r[0] for r in results.values())  # the slowest rank sets the pace
    out = {"impl": "pytorch", "torch": torch.__version__, "device": args.device,
           "model": args.model, "deconv": args.deconv, "width_divisor": args.divisor,
           "size": args.size, "batch": args.batch, "precision": args.precision,
           "step_seconds": step, "img_per_s": args.batch * args.world / step,
           "peak_rss_bytes": sum(r[1] for r in results.values()),
           "train_flop_per_image": results[0][3]}
    # ATen's own kernels' ISA, as this process runs them (ATEN_CPU_CAPABILITY caps it).
    out["aten_cpu_capability"] = next(
        (l.split(":", 1)[1].strip() for l in torch.__config__.show().splitlines()
         if "CPU capability usage" in l), "?")
    if args.device == "cuda":
        out["gpu"] = torch.cuda.get_device_name(0)
        out["peak_device_bytes"] = max(r[2] for r in results.values())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
