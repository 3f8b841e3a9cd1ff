#!/usr/bin/env python3
"""dptrain vs PyTorch on the CPU, side by side in one run (issue: CPU performance).

    pip install torch          # the peer; any recent CPU-capable build
    python3 bench/compare_pytorch.py --python "$(which python3)" [--build build/default]
                                     [--isa native|avx2|avx512_core|avx512_core_bf16|avx512_core_amx]

Cases (--cases picks by index, --list prints them): UNet16 /8 at 128x128 batch 8 and full UNet16
at 128x128 batch 2, each on 1 and 2 threads, and 2 ranks x 1 thread (mpirun) vs PyTorch DDP (gloo)
2 processes x 1 thread; then the full-width UNet16 at photograph sizes: 192x256 (HxW) batch 2 and
4, 384x544 batch 1, on 1 and 2 threads, and 192x256 batch 2 DDP. Same network
(tools/reference/models.py has dptrain's names and shapes), fp32 (or --precision bf16: dptrain's
bf16 activations and convolutions vs torch.autocast), SGD momentum 0.9, weight decay
1e-4, BCE-with-logits, same batch and image size. dptrain trains from an in-memory shard
(--cache, no augmentation; the second epoch is timed, when the shard is in memory) and prints
each step's wall time (--bench-step-times); PyTorch uses tensors made once. Each side: warm-up excluded, median of the timed steps; the two alternate
(--rounds) to cancel machine drift, and the median over rounds is reported, with each side's peak
resident memory (summed over processes) and achieved TFLOP/s: img/s x the convolutions' FLOPs
per image of a training step (pytorch_peer.py's train_flop_per_image: 3 x 2 x the forward
multiply-adds), the same count for both sides.

--isa caps both sides the same way: ONEDNN_MAX_CPU_ISA for dptrain's and PyTorch's oneDNN, and
ATEN_CPU_CAPABILITY for PyTorch's own kernels. A machine can only cap downwards; the ISA each side
really ran is read from a probe run with ONEDNN_VERBOSE=1 (oneDNN's "isa:" line) and from
torch.__config__.show(), and printed with the table, with a note when it differs from the request.

Where dptrain ran bf16 on AMX, a last column gives its share of the AMX peak: 1024 FLOP a cycle a
core (a TDPBF16PS: 16 x 32 x 16 bf16 multiply-adds in 16 cycles), times the case's threads x ranks,
times --peak-ghz (default: /proc/cpuinfo's "cpu MHz", which a VM reports as its TSC's clock, not
the turbo clock the cores may run at).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CASES = [  # (name, width divisor, batch per rank, threads per rank, ranks, HxW)
    ("unet16/8 128px b8", 8, 8, 1, 1, "128x128"),
    ("unet16/8 128px b8", 8, 8, 2, 1, "128x128"),
    ("unet16 128px b2", 1, 2, 1, 1, "128x128"),
    ("unet16 128px b2", 1, 2, 2, 1, "128x128"),
    ("unet16/8 128px b8 DDP", 8, 8, 1, 2, "128x128"),
    ("unet16 192x256 b2", 1, 2, 1, 1, "192x256"),
    ("unet16 192x256 b2", 1, 2, 2, 1, "192x256"),
    ("unet16 192x256 b4", 1, 4, 1, 1, "192x256"),
    ("unet16 192x256 b4", 1, 4, 2, 1, "192x256"),
    ("unet16 384x544 b1", 1, 1, 1, 1, "384x544"),
    ("unet16 384x544 b1", 1, 1, 2, 1, "384x544"),
    ("unet16 192x256 b2 DDP", 1, 2, 1, 2, "192x256"),
]


# --isa: (ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY); ATen's largest is avx512.
ISAS = {
    "native": (None, None),
    "avx2": ("AVX2", "avx2"),
    "avx512_core": ("AVX512_CORE", "avx512"),
    "avx512_core_bf16": ("AVX512_CORE_BF16", "avx512"),
    "avx512_core_amx": ("AVX512_CORE_AMX", "avx512"),
}


def isa_env(isa):
    onednn, aten = ISAS[isa]
    env = dict(os.environ)
    for k in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"):
        env.pop(k, None)
    if onednn:
        env.update(ONEDNN_MAX_CPU_ISA=onednn, DNNL_MAX_CPU_ISA=onednn, ATEN_CPU_CAPABILITY=aten)
    return env


def verbose_isa(text):
    """oneDNN's own words for the ISA it dispatches to, from an ONEDNN_VERBOSE=1 log."""
    m = re.search(r"_verbose,(?:v\d+,)?info,cpu,isa:(.*)", text)  # oneDNN 3 adds "v1,"
    return m.group(1).strip() if m else "no oneDNN primitive ran"


def probe_isas(args, data, work, env):
    """What each side really runs under `env`: (dptrain's oneDNN ISA name and verbose text,
    PyTorch's oneDNN verbose text, PyTorch's ATen capability)."""
    env = dict(env, ONEDNN_VERBOSE="1", DNNL_VERBOSE="1", OMP_NUM_THREADS="1")
    model_dir = os.path.join(work, "probe")
    subprocess.run(["rm", "-rf", model_dir], check=True)
    out = subprocess.run([os.path.join(args.build, "app", "dptrain"), "--data", data,
                          "--width-divisor", "8", "--batch-size", "2", "--epochs", "1",
                          "--max-steps", "1", "--val-every", "1000000", "--model-dir", model_dir],
                         env=env, check=True, capture_output=True, text=True).stdout
    m = re.search(r"device cpu \(oneDNN[^,]*, ([^)]*)\)", out)
    dp_name = m.group(1) if m else "?"
    pt = subprocess.run([args.python, os.path.join(HERE, "pytorch_peer.py"), "--divisor", "8",
                         "--size", "128", "--batch", "1", "--warmup", "0", "--steps", "1"],
                        env=env, check=True, capture_output=True, text=True).stdout
    aten = json.loads(pt.strip().splitlines()[-1]).get("aten_cpu_capability", "?")
    return dp_name, verbose_isa(out), verbose_isa(pt), aten


def run_dptrain(build, data, work, divisor, batch, threads, ranks, warmup, steps, precision,
                env):
    model_dir = os.path.join(work, "run")
    subprocess.run(["rm", "-rf", model_dir], check=True)
    train_images = (warmup + steps) * batch * ranks
    cmd = [os.path.join(build, "app", "dptrain"), "--data", data, "--width-divisor", str(divisor),
           "--batch-size", str(batch), "--epochs", "2", "--max-steps", str(warmup + steps),
           "--model-dir", model_dir, "--augment", "none", "--cache", "--bench-step-times",
           "--val-every", "1000000", "--precision", precision]
    env = dict(env, OMP_NUM_THREADS=str(threads))
    flags = ["--oversubscribe", "--mca", "pml", "ob1", "--mca", "btl", "self,vader"]
    flags += ["--bind-to", "core" if threads == 1 else "none"]
    if os.geteuid() == 0:
        flags.append("--allow-run-as-root")
    out = subprocess.run(["mpirun", "-np", str(ranks)] + flags + cmd, env=env, check=True,
                         capture_output=True, text=True).stdout
    times = [float(l.split()[-1]) for l in out.splitlines() if "bench: step_seconds" in l]
    rss = [float(l.split()[2]) for l in out.splitlines() if "bench: peak_rss_mib_total" in l]
    if len(times) < 2 * (warmup + steps) or not rss:
        raise SystemExit(f"dptrain printed no step times:\n{out}")
    # The second epoch: the shard is in memory (--cache) as PyTorch's tensors are.
    step = statistics.median(times[warmup + steps + warmup:])
    assert train_images >= batch * ranks
    return batch * ranks / step, rss[0]


AMX_FLOP_PER_CYCLE = 1024  # bf16, one core


def cpuinfo_ghz():
    with open("/proc/cpuinfo") as f:
        m = re.search(r"^cpu MHz\s*:\s*([0-9.]+)", f.read(), re.M)
    return float(m.group(1)) / 1e3 if m else None


def run_torch(python, divisor, batch, threads, ranks, size, warmup, steps, precision, env):
    out = subprocess.run([python, os.path.join(HERE, "pytorch_peer.py"), "--world", str(ranks),
                          "--threads", str(threads), "--divisor", str(divisor), "--size", size,
                          "--batch", str(batch), "--warmup", str(warmup), "--steps", str(steps),
                          "--precision", precision],
                         env=env, check=True, capture_output=True, text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return r["img_per_s"], r["peak_rss_bytes"] / 2**20, r["torch"], r["train_flop_per_image"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable, help="the Python that has PyTorch")
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "default"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--cases", default="all", help="comma-separated indices into the case list")
    ap.add_argument("--list", action="store_true", help="print the cases with their indices")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: dptrain --precision bf16 vs torch.autocast(bfloat16)")
    ap.add_argument("--isa", choices=list(ISAS), default="native",
                    help="cap both sides' CPU instruction set (only downwards)")
    ap.add_argument("--peak-ghz", type=float, default=None,
                    help="the clock of the AMX peak (default: /proc/cpuinfo's cpu MHz)")
    args = ap.parse_args()
    if args.list:
        for i, (name, _, _, t, r, _) in enumerate(CASES):
            print(f"{i:2d} {name} ({r} rank(s) x {t} thread(s))")
        return
    env = isa_env(args.isa)
    cases = CASES if args.cases == "all" else [CASES[int(i)] for i in args.cases.split(",")]
    with tempfile.TemporaryDirectory() as work:
        datasets = {}  # HxW -> a synthetic set big enough for every case of that size
        for _, _, b, _, r, size in cases + [CASES[0]]:
            datasets[size] = max(datasets.get(size, 0), (args.warmup + args.steps) * b * r)
        for size, n in datasets.items():
            datasets[size] = os.path.join(work, f"bench_{size}.h5")
            subprocess.run([os.path.join(args.build, "app", "dpprep"), "synth", "--out",
                            datasets[size], "--train", str(n), "--val", "0", "--size", size],
                           check=True, capture_output=True)
        dp_name, dp_isa, pt_isa, aten = probe_isas(args, datasets["128x128"], work, env)
        print(f"--isa {args.isa}: dptrain ran oneDNN {dp_name} ({dp_isa}); PyTorch ran oneDNN "
              f"({pt_isa}), ATen {aten}")
        if args.isa != "native" and dp_name != args.isa:
            print(f"note: this CPU cannot run {args.isa} (a machine can only cap downwards): "
                  f"both sides ran its best instead, {dp_name}")
        ghz = args.peak_ghz or cpuinfo_ghz()
        amx = "amx" in dp_name and args.precision == "bf16" and ghz is not None
        print(f"{'case':26s} {'thr':>3s} {'dptrain img/s':>13s} {'PyTorch img/s':>13s} "
              f"{'ratio':>6s} {'dp TFLOP/s':>10s} {'PT TFLOP/s':>10s} {'dptrain MiB':>11s} "
              f"{'PyTorch MiB':>11s} {'mem ratio':>9s}" + (f" {'AMX peak':>8s}" if amx else ""))
        version = "?"
        for name, d, b, t, r, size in cases:
            dp, pt, dp_mem, pt_mem = [], [], [], []
            for _ in range(args.rounds):  # alternate the two to cancel drift
                ips, mem = run_dptrain(args.build, datasets[size], work, d, b, t, r, args.warmup,
                                       args.steps, args.precision, env)
                dp.append(ips), dp_mem.append(mem)
                ips, mem, version, flop = run_torch(args.python, d, b, t, r, size, args.warmup,
                                                    args.steps, args.precision, env)
                pt.append(ips), pt_mem.append(mem)
            a, p = statistics.median(dp), statistics.median(pt)
            ma, mp_ = max(dp_mem), max(pt_mem)
            share = a * flop / (t * r * AMX_FLOP_PER_CYCLE * ghz * 1e9) if amx else 0.0
            print(f"{name:26s} {t * r:3d} {a:13.2f} {p:13.2f} {a / p:6.2f} {a * flop / 1e12:10.3f} "
                  f"{p * flop / 1e12:10.3f} {ma:11.0f} {mp_:11.0f} {ma / mp_:9.2f}"
                  + (f" {100 * share:7.1f}%" if amx else ""), flush=True)
        print(f"PyTorch {version}; {args.precision}; --isa {args.isa}; {args.rounds} rounds, median of "
              f"{args.steps} steps after {args.warmup} warm-up each")
        if amx:
            print(f"AMX peak: {AMX_FLOP_PER_CYCLE} FLOP a cycle a core x threads x ranks x "
                  f"{ghz:.2f} GHz ({'--peak-ghz' if args.peak_ghz else '/proc/cpuinfo'})")


if __name__ == "__main__":
    main()
