#!/usr/bin/env python3
"""Where a dptrain step's time goes: oneDNN primitives by pass and by layer, and the rest.

    python3 bench/primitive_share.py [--build build/default] [--divisor 1] [--batch 2] [--threads 1]
                                     [--size 128x128] [--precision fp32|bf16] [--layers 10]
                                     [--cpu-conv auto|direct|winograd]

Runs one rank of dptrain on synthetic data of --size (HxW) with ONEDNN_VERBOSE=1 (oneDNN prints
each executed primitive with its time) and --bench-step-times (dptrain prints each step's wall
time), sums the primitive times between step lines and prints, per step and as the median over
the steps after --warmup: the step time, the summed primitive time and their ratio; then, per step
after warm-up, the time of each pass (convolution forward, data gradient, weight gradient, and
the other primitive kinds: reorders, element-wise, pooling, ...) with its share of the step, the
time outside oneDNN (dptrain's own passes: ReLU and bias fused where oneDNN cannot, upsampling,
concatenation copies, the loss, the optimiser, gradient all-reduce bookkeeping), and the --layers
slowest convolution layers (by shape) with their three passes. The verbose printing itself is
inside the step time, so the shares are lower bounds.
"""
import argparse
import collections
import os
import statistics
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "default"))
    ap.add_argument("--divisor", type=int, default=1)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--cpu-conv", default="auto", help="dptrain --cpu-conv")
    ap.add_argument("--size", default="128x128", help="HxW of the synthetic images")
    ap.add_argument("--layers", type=int, default=10, help="slowest convolution shapes listed")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        data = os.path.join(work, "d.h5")
        subprocess.run([os.path.join(args.build, "app", "dpprep"), "synth", "--out", data,
                        "--train", str(args.steps * args.batch), "--val", "0", "--size",
                        args.size], check=True, capture_output=True)
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), ONEDNN_VERBOSE="1",
                   DNNL_VERBOSE="1")
        cmd = ["stdbuf", "-oL", "-eL", os.path.join(args.build, "app", "dptrain"), "--data", data,
               "--width-divisor", str(args.divisor), "--batch-size", str(args.batch),
               "--epochs", "1", "--model-dir", os.path.join(work, "run"), "--augment", "none",
               "--bench-step-times", "--val-every", "1000", "--precision", args.precision,
               "--cpu-conv", args.cpu_conv]
        out = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True).stdout
    steps, prim, kinds, layers = [], 0.0, collections.Counter(), collections.Counter()
    step_kinds, step_layers = [], []
    for line in out.splitlines():
        if line.startswith(("dnnl_verbose,exec", "onednn_verbose,exec")):
            f = line.split(",")
            sec = float(f[-1]) / 1e3
            prim += sec
            kind, prop = f[3], f[5]
            if kind == "convolution":
                kinds[f"convolution {prop}"] += sec
                layers[(f[-2], prop)] += sec  # the problem descriptor: mb, channels, sizes
            else:
                kinds[kind] += sec
        elif "bench: step_seconds" in line:
            steps.append((float(line.split()[-1]), prim))
            step_kinds.append(kinds)
            step_layers.append(layers)
            prim, kinds, layers = 0.0, collections.Counter(), collections.Counter()
    timed = steps[args.warmup:]
    if not timed:
        raise SystemExit("no timed steps: " + out[-2000:])
    for i, (s, p) in enumerate(steps):
        print(f"step {i + 1}: {s * 1e3:8.1f} ms, primitives {p * 1e3:8.1f} ms ({p / s:6.1%})"
              + ("  (warm-up)" if i < args.warmup else ""))
    s = statistics.median(t for t, _ in timed)
    p = statistics.median(q for _, q in timed)
    print(f"median after warm-up: step {s * 1e3:.1f} ms, primitives {p * 1e3:.1f} ms, "
          f"share {p / s:.1%}")
    n = len(timed)
    mean_step = sum(t for t, _ in timed) / n
    total = collections.Counter()
    for k in step_kinds[args.warmup:]:
        total.update(k)
    print(f"per step after warm-up (mean step {mean_step * 1e3:.1f} ms):")
    for kind, sec in total.most_common():
        print(f"  {kind:40s} {sec / n * 1e3:9.1f} ms {sec / n / mean_step:7.1%}")
    outside = mean_step - sum(total.values()) / n
    print(f"  {'outside oneDNN':40s} {outside * 1e3:9.1f} ms {outside / mean_step:7.1%}")
    by_shape = collections.defaultdict(dict)
    for layer in step_layers[args.warmup:]:
        for (shape, prop), sec in layer.items():
            by_shape[shape][prop] = by_shape[shape].get(prop, 0.0) + sec / n
    print(f"slowest convolution shapes (ms per step: forward / data gradient / weight gradient):")
    ranked = sorted(by_shape.items(), key=lambda kv: -sum(kv[1].values()))
    for shape, props in ranked[:args.layers]:
        fwd = props.get("forward_training", 0.0) + props.get("forward_inference", 0.0)
        print(f"  {shape:58s} {fwd * 1e3:7.1f} {props.get('backward_data', 0.0) * 1e3:7.1f} "
              f"{props.get('backward_weights', 0.0) * 1e3:7.1f}")


if __name__ == "__main__":
    main()
