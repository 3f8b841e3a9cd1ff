#!/usr/bin/env python3
"""Data-parallel efficiency of UNet16 at 448x448 on 8-512 GPUs: alpha-beta all-reduce + bucket overlap.

Also checks the model against the 2-namespace-node run of bench/cluster_bench.sh (--check).

Inputs: a per-parameter gradient-ready timeline from bench_backward_timeline (CSV: index, name, bytes,
ready_ms in backward order; last row "end,backward,0,<backward ms>"), the step time of the target
(H200 figures of bench/README.md) and the network constants below. Every constant says where it comes
from; docs/cluster.md ("Past this machine, on paper") explains the model and its results.

Usage: python3 bench/scaling_model.py [--timeline bench/scaling_inputs/timeline_unet16_224.csv]
       python3 bench/scaling_model.py --check   # the 2-namespace-node comparison only
Standard library only (no numpy).
"""
import argparse
import csv
import math
import os

HERE = os.path.dirname(os.path.abspath(__file__))
INPUTS = os.path.join(HERE, "scaling_inputs")
MiB = 1024.0 * 1024.0

# ---- The target step (measured on the H200 earlier: bench/README.md, "GPU training throughput") ----
H200_BATCH = 16                   # images per GPU per step in those runs
H200_IMG_S = {"fp32 (TF32)": 114.0, "bf16": 210.0}  # dptrain img/s, second row of that table
# Backward share of the step: the H200 convolution kernels (ncu, same section) were fprop 23 ms,
# dgrad 24 ms, wgrad 55 ms; backward = (24 + 55) / (23 + 24 + 55). Assumed: the other kernels
# (activations, upsampling, concat, SGD) split in the same ratio.
H200_BACKWARD_SHARE = (24.0 + 55.0) / (23.0 + 24.0 + 55.0)
GRAD_BYTES_PER_PARAM = 4          # fp32 gradients in both precisions (docs/DESIGN.md, Precision)

# ---- The network (assumed unless a source is named) ----
GPUS_PER_NODE = 8                 # HGX H200 board: 8 GPUs (NVIDIA H200 product brief)
NVLINK_GBS = 450.0                # NVLink 4: 900 GB/s per GPU total = 450 GB/s each way (NVIDIA spec)
NVLINK_EFF = 0.80                 # assumed fraction reached by NCCL's ring inside a node
# 4 x 200 Gb/s InfiniBand (NDR200) per node = 100 GB/s each way (the example network)
NODE_NIC_GBS = 4 * 200 / 8.0
NIC_EFF = 0.90                    # assumed fraction of line rate reached (headers, protocol)
ALPHA_NVLINK_S = 2e-6             # assumed per-step latency of one NCCL ring step inside a node
ALPHA_IB_S = 6e-6                 # assumed per-step latency across InfiniBand (NIC + switch + NCCL proxy)
LAUNCH_S = 15e-6                  # assumed fixed cost per bucket (one ncclAllReduce launch + stream event)

# ---- dptrain's bucket plan (mpi/include/dp/grad_reducer.hpp: kDefaultFirstBucketMiB, kDefaultBucketMiB;
# app/train/options.hpp: bucket_mb = 25, overlap = true) ----
FIRST_BUCKET_MIB = 1.0
DEFAULT_BUCKET_MIB = 25.0


def read_timeline(path):
    """[(name, bytes, ready fraction of backward)] in backward order, the backward ms, the header lines."""
    rows, header, backward_ms = [], [], None
    with open(path) as f:
        lines = [l for l in f if l.strip()]
    header = [l.strip() for l in lines if l.startswith("#")]
    for r in csv.DictReader(l for l in lines if not l.startswith("#")):
        if r["index"] == "end":
            backward_ms = float(r["ready_ms"])
        else:
            rows.append((r["name"], int(r["bytes"]), float(r["ready_ms"])))
    assert backward_ms, f"{path}: no end row"
    return [(n, b, t / backward_ms) for n, b, t in rows], backward_ms, header


def buckets(timeline, bucket_mib, first_mib=FIRST_BUCKET_MIB):
    """dptrain's BucketPlan: the arena in backward order cut into a first bucket of first_mib and then
    bucket_mib pieces; a bucket is ready when the last tensor overlapping it is ready.
    Returns [(bytes, ready fraction)]. (The 64-byte alignment padding is ignored: < 4 KiB in all.)"""
    first = min(first_mib, bucket_mib) * MiB
    later = bucket_mib * MiB
    out, start, pos = [], 0.0, 0.0
    size = first
    ready = 0.0
    for _, nbytes, t in timeline:
        end = pos + nbytes
        ready = max(ready, t)
        while end >= start + size - 1e-9:  # this tensor completes the current bucket
            out.append((size, ready))
            start += size
            size = later
        pos = end
    if pos > start:
        out.append((pos - start, ready))
    return out


class Network:
    """Alpha-beta costs of one all-reduce of `nbytes` over n GPUs (NCCL-like algorithms)."""

    def __init__(self, nvlink_gbs=NVLINK_GBS * NVLINK_EFF, node_gbs=NODE_NIC_GBS * NIC_EFF,
                 alpha_nv=ALPHA_NVLINK_S, alpha_ib=ALPHA_IB_S, launch=LAUNCH_S,
                 gpus_per_node=GPUS_PER_NODE):
        self.bw_nv = nvlink_gbs * 1e9
        self.bw_node = node_gbs * 1e9
        self.alpha_nv, self.alpha_ib, self.launch = alpha_nv, alpha_ib, launch
        self.g = gpus_per_node

    def ring(self, nbytes, n):
        # Flat ring over n GPUs: 2(n-1) steps of nbytes/n. Every step waits for its slowest link
        # (InfiniBand once n spans nodes). Across nodes each ring edge between two nodes carries the
        # same bytes as every other edge; NCCL runs one ring per NIC so the node's NICs share it:
        # the bandwidth is min(NVLink per GPU, the node's NICs).
        if n == 1:
            return 0.0
        multi = n > self.g
        alpha = self.alpha_ib if multi else self.alpha_nv
        bw = min(self.bw_nv, self.bw_node) if multi else self.bw_nv
        return self.launch + 2 * (n - 1) * alpha + 2.0 * (n - 1) / n * nbytes / bw

    def tree(self, nbytes, n):
        # NCCL's tree: a chain inside each node, a double binary tree across nodes; reduce up then
        # broadcast down, pipelined: latency 2(log2(nodes) alpha_ib + (g-1) alpha_nv), bandwidth term
        # 2 * nbytes / node bandwidth (each node receives and sends the whole vector once per phase,
        # split over the two trees; Thakur et al. 2005 pipelined reduce + broadcast). Inside one
        # node NCCL rings, so the tree applies only across nodes.
        nodes = n // self.g
        if nodes <= 1:
            return self.ring(nbytes, n)
        lat = 2 * (math.log2(nodes) * self.alpha_ib + (self.g - 1) * self.alpha_nv)
        return self.launch + lat + 2.0 * nbytes / min(self.bw_nv, self.bw_node)

    def best(self, nbytes, n):
        return min(self.ring(nbytes, n), self.tree(nbytes, n))


def step_time(forward_s, backward_s, bkts, cost, overlap=True):
    """Forward + backward + the all-reduce time left exposed. With overlap, bucket k starts at
    max(its ready time, the end of bucket k-1) (dptrain releases buckets in order, one stream);
    without, all start after backward, one after another. Returns (step s, exposed comm s)."""
    done = 0.0
    for nbytes, ready in bkts:
        start = max(ready * backward_s if overlap else backward_s, done)
        done = start + cost(nbytes)
    exposed = max(0.0, done - backward_s)
    return forward_s + backward_s + exposed, exposed


def efficiency(forward_s, backward_s, bkts, cost, overlap=True):
    """Weak scaling (fixed batch per GPU): N-GPU throughput / (N x one GPU's)."""
    t, exposed = step_time(forward_s, backward_s, bkts, cost, overlap)
    return (forward_s + backward_s) / t, exposed


def predict(args):
    timeline, cpu_bwd_ms, header = read_timeline(args.timeline)
    total = sum(b for _, b, _ in timeline)
    net = Network(nvlink_gbs=args.nvlink_gbs * NVLINK_EFF, node_gbs=args.node_gbs * NIC_EFF,
                  gpus_per_node=args.gpus_per_node)
    print(f"timeline: {os.path.relpath(args.timeline)} ({len(timeline)} tensors, {total / MiB:.1f} MiB of "
          f"gradients)")
    for h in header:
        print("  " + h)
    print(f"network: {args.gpus_per_node} GPUs/node, NVLink {args.nvlink_gbs:.0f} GB/s x {NVLINK_EFF}, node "
          f"NICs {args.node_gbs:.1f} GB/s x {NIC_EFF}, alpha NVLink {ALPHA_NVLINK_S * 1e6:.0f} us, IB "
          f"{ALPHA_IB_S * 1e6:.0f} us, {LAUNCH_S * 1e6:.0f} us per bucket")
    print("all-reduce of the whole gradient (ms), ring / tree:")
    for n in args.gpus:
        print(f"  {n:4d} GPUs: {net.ring(total, n) * 1e3:7.2f} / {net.tree(total, n) * 1e3:7.2f}")
    sizes = [1, 2, 5, 10, 25, 50, 100, math.ceil(total / MiB)]
    for prec, img_s in H200_IMG_S.items():
        # Another batch per GPU: the step scaled linearly (assumed; a GPU is less efficient at
        # small batches, so this flatters small batches' compute and understates their comm share).
        step = H200_BATCH / img_s * args.batch_per_gpu / H200_BATCH
        bwd, fwd = step * H200_BACKWARD_SHARE, step * (1 - H200_BACKWARD_SHARE)
        print(f"\nH200 {prec}: step {step * 1e3:.1f} ms for batch {args.batch_per_gpu} ({img_s:.0f} img/s at "
              f"batch {H200_BATCH}, bench/README.md); backward {bwd * 1e3:.1f} ms ({H200_BACKWARD_SHARE:.1%}), forward+rest "
              f"{fwd * 1e3:.1f} ms; backward timeline shape from the CPU file")
        for algo in ("ring", "tree", "best"):
            cost_of = getattr(net, algo)
            print(f"  {algo}: efficiency by bucket MiB (overlapped; exposed all-reduce ms)")
            print("    GPUs | " + " | ".join(f"{s:>12}" for s in sizes) + " | no overlap, 25 MiB")
            for n in args.gpus:
                cells = []
                for s in sizes:
                    e, x = efficiency(fwd, bwd, buckets(timeline, s), lambda b: cost_of(b, n))
                    cells.append(f"{e:6.1%} {x * 1e3:5.1f}")
                e0, x0 = efficiency(fwd, bwd, buckets(timeline, DEFAULT_BUCKET_MIB),
                                    lambda b: cost_of(b, n), overlap=False)
                print(f"    {n:4d} | " + " | ".join(cells) + f" | {e0:6.1%} {x0 * 1e3:5.1f}")
        # The recommendation: per N, the bucket size with the best efficiency (algorithm: best).
        print("  recommended (best of ring/tree per bucket, overlapped):")
        for n in args.gpus:
            res = [(efficiency(fwd, bwd, buckets(timeline, s), lambda b: net.best(b, n))[0], s)
                   for s in sizes]
            e_best, s_best = max(res)
            e_def = dict((s, e) for e, s in res)[DEFAULT_BUCKET_MIB]
            print(f"    {n:4d} GPUs: best {s_best} MiB at {e_best:.1%}; dptrain default 25 MiB "
                  f"{e_def:.1%}")


def check(args):
    """The 2-namespace-node run of bench/cluster_bench.sh: UNet16 /8, 64x64, batch 4 per rank, one
    rank per node over TCP (veth + bridge), 1 thread per rank, --cpu-conv direct."""
    timeline, bwd_ms, header = read_timeline(args.check_timeline)
    total = sum(b for _, b, _ in timeline)
    fwd_ms = args.check_forward_ms
    # The veth "network", from bench_allreduce --bind-to none in bench/README.md (GradReducer ring,
    # 2 ranks): 6.09 ms for 1.8 MiB and 393.31 ms for 111.8 MiB. A 2-rank ring is 2 alpha + S/beta.
    s1, t1, s2, t2 = 1.8 * MiB, 6.09e-3, 111.8 * MiB, 393.31e-3
    inv_bw = (t2 - t1) / (s2 - s1)
    alpha = max(0.0, (t1 - s1 * inv_bw) / 2)
    cost = lambda b: 2 * alpha + b * inv_bw  # noqa: E731
    print(f"check: {os.path.relpath(args.check_timeline)} ({total / MiB:.2f} MiB of gradients)")
    for h in header:
        print("  " + h)
    print(f"veth fit from bench/README.md: {1 / inv_bw / 1e9:.2f} GB/s, alpha {alpha * 1e3:.2f} ms; "
          f"whole arena {cost(total) * 1e3:.2f} ms")
    fwd, bwd = fwd_ms / 1e3, bwd_ms / 1e3
    for overlap in (True, False):
        e, x = efficiency(fwd, bwd, buckets(timeline, DEFAULT_BUCKET_MIB), cost, overlap)
        print(f"  {'overlapped ' if overlap else '--no-overlap'}: step {(fwd + bwd + x) * 1e3:.1f} ms "
              f"(forward+loss {fwd_ms:.1f}, backward {bwd_ms:.1f}, exposed all-reduce {x * 1e3:.2f}); "
              f"efficiency {e:.1%}, predicted 2-rank img/s {2 * 4 / (fwd + bwd + x):.1f} "
              f"(SGD and loader time not in the model)")
    # The namespace nodes share 2 cores with each other and with other users' jobs: with a load
    # average L on C cores a 1-thread rank gets about C/L of a core (assumed fair share).
    if args.check_load:
        share = min(1.0, args.check_cores / args.check_load)
        for overlap in (True, False):
            t, x = step_time(fwd / share, bwd / share, buckets(timeline, DEFAULT_BUCKET_MIB), cost, overlap)
            print(f"  {'overlapped ' if overlap else '--no-overlap'} at load {args.check_load} on "
                  f"{args.check_cores} cores (compute x {1 / share:.2f}): step {t * 1e3:.1f} ms, 2-rank "
                  f"img/s {2 * 4 / t:.1f}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--timeline", default=os.path.join(INPUTS, "timeline_unet16_224.csv"))
    p.add_argument("--gpus", type=int, nargs="+", default=[8, 64, 512])
    p.add_argument("--gpus-per-node", type=int, default=GPUS_PER_NODE)
    p.add_argument("--node-gbs", type=float, default=NODE_NIC_GBS,
                   help="inter-node GB/s per node, each way, line rate (x NIC_EFF)")
    p.add_argument("--nvlink-gbs", type=float, default=NVLINK_GBS,
                   help="intra-node GB/s per GPU, each way (x NVLINK_EFF)")
    p.add_argument("--batch-per-gpu", type=int, default=H200_BATCH,
                   help="images per GPU per step (the H200 step time is scaled linearly: assumed)")
    p.add_argument("--check", action="store_true", help="only the 2-namespace-node check")
    p.add_argument("--check-timeline", default=os.path.join(INPUTS, "timeline_unet16d8_64_b4.csv"))
    p.add_argument("--check-forward-ms", type=float, default=None,
                   help="forward+loss ms of the check configuration (default: the file's header)")
    p.add_argument("--check-load", type=float, default=None,
                   help="load average during the measured run: compute slowed to cores/load of a core")
    p.add_argument("--check-cores", type=int, default=2)
    args = p.parse_args()
    if args.check_forward_ms is None:
        with open(args.check_timeline) as f:
            for line in f:
                if line.startswith("# forward+loss median ms"):
                    args.check_forward_ms = float(line.split()[4].rstrip(";"))
    if not args.check:
        predict(args)
        print()
    check(args)


if __name__ == "__main__":
    main()
