#!/usr/bin/env python3
"""How much of a dptrain step is oneDNN primitives (issue: CPU performance; target >= 90%).

    python3 bench/primitive_share.py [--build build/default] [--divisor 1] [--batch 2] [--threads 1]
                                     [--cpu-conv auto|direct|winograd]

Runs one rank of dptrain on synthetic 128x128 data with ONEDNN_VERBOSE=1 (oneDNN prints each
executed primitive with its time) and --bench-step-times (dptrain prints each step's wall time),
sums the primitive times between step lines and prints, per step and as the median over the steps
after --warmup: the step time, the summed primitive time, their ratio, and the top primitive
kinds. The verbose printing itself is inside the step time, so the share is a lower bound.
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
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        data = os.path.join(work, "d.h5")
        subprocess.run([os.path.join(args.build, "app", "dpprep"), "synth", "--out", data,
                        "--train", str(args.steps * args.batch), "--val", "0", "--size",
                        "128x128"], check=True, capture_output=True)
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), ONEDNN_VERBOSE="1",
                   DNNL_VERBOSE="1")
        cmd = ["stdbuf", "-oL", "-eL", os.path.join(args.build, "app", "dptrain"), "--data", data,
               "--width-divisor", str(args.divisor), "--batch-size", str(args.batch),
               "--epochs", "1", "--model-dir", os.path.join(work, "run"), "--augment", "none",
               "--bench-step-times", "--val-every", "1000", "--precision", args.precision,
               "--cpu-conv", args.cpu_conv]
        out = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True).stdout
    steps, prim, kinds = [], 0.0, collections.Counter()
    step_kinds = []
    for line in out.splitlines():
        if line.startswith(("dnnl_verbose,exec", "onednn_verbose,exec")):
            f = line.split(",")
            ms = float(f[-1])
            prim += ms / 1e3
            kinds[f"{f[3]} {f[5]} ({f[4]})"] += ms / 1e3
        elif "bench: step_seconds" in line:
            steps.append((float(line.split()[-1]), prim))
            step_kinds.append(kinds)
            prim, kinds = 0.0, collections.Counter()
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
    total = collections.Counter()
    for k in step_kinds[args.warmup:]:
        total.update(k)
    n = len(timed)
    for kind, sec in total.most_common(8):
        print(f"  {kind:60s} {sec / n * 1e3:8.1f} ms/step")


if __name__ == "__main__":
    main()
