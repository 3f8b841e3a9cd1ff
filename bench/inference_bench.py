"""Whole-photograph CPU inference: dppredict against PyTorch and ONNX Runtime, Mpx/s and peak RSS.

    python3 -m venv /tmp/pt && /tmp/pt/bin/pip install torch onnxruntime pillow numpy h5py
    python3 bench/inference_bench.py --python /tmp/pt/bin/python [--checkpoint CKPT]
        [--threads 1 2] [--precision fp32 bf16] [--sizes 3456x2304 1024x768] [--repeats 3]
        [--isa native|avx2|...] [--engines dppredict torch ort] [--cpu-conv direct] [--work DIR]
        [--folder N]
    python3 bench/inference_bench.py --python /tmp/pt/bin/python --check-only   # agreement only

Each synthetic photograph (a deterministic JPEG with crack-like lines, made here; sizes are
WIDTHxHEIGHT) is predicted whole, in tiles of the checkpoint's training size overlapping by
dppredict's default (a quarter of the smaller tile side), by three engines:

- dppredict: the whole command is timed (process start, checkpoint, the timing of its kernel
  candidates at first use where --cpu-conv auto is asked for, JPEG decode, tiling, network,
  blending, mask PNG encode); threads through OMP_NUM_THREADS, `--precision`. With --folder N,
  also one command on a folder of N copies of the photograph (an inspection run: start-up once),
  per photograph.
- PyTorch: tools/reference/models.py with the checkpoint's weights (its averaged ones where it has
  them, as dppredict), eval, torch.inference_mode, channels_last, torch.set_num_threads; bf16 as
  torch.autocast("cpu", torch.bfloat16). Input normalised by the checkpoint's recorded statistics
  with dppredict's float expression.
- ONNX Runtime: the model `dpexport` writes (pixels 0..255, normalisation folded), CPU provider,
  intra_op_num_threads = threads, inter_op 1, sequential execution; fp32 only (its CPU provider
  has no bf16 path).

The peers replicate dppredict's TiledRunner (app/predict/tiling.cpp) in NumPy: the same tile grid
(tile_starts), reflect padding (reflect_index), batches of dppredict's tiles per forward pass,
sin^2 window weights multiplied over rows and columns, sum(w p) / sum(w). They are timed per
photograph in a warm process (JPEG decode with Pillow, tiling, network, blending, mask PNG
encode); their start-up (imports, weights, session, first photograph's extra cost) is its own
column, and dppredict's start-up is the whole command on a photograph of one tile (the report
also sets dppredict's whole command against the fastest peer's launch-to-first-mask time). Every
engine runs in a child process of its own (peak RSS from wait4); each measurement is the median
of --repeats after one warm-up (dppredict: one whole command first).

Before timing, dppredict's probabilities of the smallest photograph (fp32, 32-bit float TIFF) are
compared with both peers' (max |p - p_dppredict|): the proof that the tiling is replicated.
Without --checkpoint a short dptrain run makes one (dpprep synth at --train-size, UNet16 /8, two
steps). --isa caps oneDNN (dppredict's and PyTorch's) and ATen as bench/compare_pytorch.py does.
ONNX Runtime's own kernels (MLAS) have no such cap, so at --isa avx2 or avx512_core both peers run
under bench/cpuid_cap.c (an LD_PRELOAD shim, built as the target cpuid_cap), which hides the CPU
features above the ISA from their CPUID; the report says how many CPUID instructions it answered
in the probe process (PyTorch and ONNX Runtime imported, one convolution each).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from compare_pytorch import ISAS, isa_env, verbose_isa  # noqa: E402

ENGINES = ("dppredict", "torch", "ort")
ENGINE_NAMES = {"dppredict": "dppredict", "torch": "PyTorch", "ort": "ONNX Runtime"}
# fp32 probabilities: 2e-7 measured with the two-step checkpoint; room for a trained model's
# larger logits, 50x below the 0.01 of the control (a plain mean instead of the window).
AGREEMENT_TOLERANCE = 1e-3


# ---------------------------------------------------------------------------------------------
# dppredict's tiling and blending (app/predict/tiling.cpp), for the peers. NumPy is imported
# inside the functions: the parent process runs on the standard library alone.
# ---------------------------------------------------------------------------------------------

def tile_starts(length, tile, overlap, margin=0):
    """Start offsets of the tiles along one axis, as dp::app::tile_starts (integer arithmetic)."""
    extended = length + 2 * margin
    if extended <= tile:
        return [-((tile - extended) // 2) - margin]
    span = extended - tile
    stride = tile - overlap
    n = (span + stride - 1) // stride + 1
    return [(2 * i * span + (n - 1)) // (2 * (n - 1)) - margin for i in range(n)]


def reflect_index(i, length):
    """dp::app::reflect_index on an array of positions: reflection without repeating the edge."""
    import numpy as np
    if length == 1:
        return np.zeros_like(i)
    period = 2 * (length - 1)
    m = np.mod(i, period)
    return np.where(m < length, m, period - m)


def window_weights(tile):
    """sin^2(pi (i + 0.5) / tile) in double, stored as float32 (dp::app::window_weights)."""
    import numpy as np
    s = np.sin(np.pi * (np.arange(tile, dtype=np.float64) + 0.5) / tile)
    return (s * s).astype(np.float32)


def sigmoid(x):
    import numpy as np
    one = np.float32(1)
    return one / (one + np.exp(-x, dtype=np.float32))


def predict_tiled(image, forward, tile_h, tile_w, overlap, batch, margin=0, flat=False):
    """Probabilities [h, w] of an RGB uint8 image [h, w, 3] through forward(tiles uint8 [n, th,
    tw, 3]) -> logits float32 [n, th, tw], tile by tile as dppredict's TiledRunner: tiles in row
    order, `batch` per forward pass, sigmoid, window-weighted sum / summed weight (flat: a plain
    mean instead, the agreement check's control)."""
    import numpy as np
    h, w = image.shape[:2]
    ys = tile_starts(h, tile_h, overlap, margin)
    xs = tile_starts(w, tile_w, overlap, margin)
    win = window_weights(tile_h)[:, None] * window_weights(tile_w)[None, :]
    if flat:
        win = np.ones_like(win)
    acc = np.zeros((h, w), np.float32)
    weight = np.zeros((h, w), np.float32)
    tiles = np.empty((batch, tile_h, tile_w, 3), np.uint8)
    slots = []

    def run():
        probs = sigmoid(forward(tiles[:len(slots)]))
        for k, (y0, x0) in enumerate(slots):
            ya, yb = max(y0, 0), min(y0 + tile_h, h)  # reflect padding: computed, not kept
            xa, xb = max(x0, 0), min(x0 + tile_w, w)
            wt = win[ya - y0:yb - y0, xa - x0:xb - x0]
            acc[ya:yb, xa:xb] += wt * probs[k, ya - y0:yb - y0, xa - x0:xb - x0]
            weight[ya:yb, xa:xb] += wt
        slots.clear()

    for y0 in ys:
        for x0 in xs:
            k = len(slots)
            if y0 >= 0 and x0 >= 0 and y0 + tile_h <= h and x0 + tile_w <= w:
                tiles[k] = image[y0:y0 + tile_h, x0:x0 + tile_w]
            else:
                rows = reflect_index(np.arange(y0, y0 + tile_h), h)
                cols = reflect_index(np.arange(x0, x0 + tile_w), w)
                tiles[k] = image[rows[:, None], cols[None, :]]
            slots.append((y0, x0))
            if len(slots) == batch:
                run()
    if slots:
        run()
    return acc / weight


# ---------------------------------------------------------------------------------------------
# Children: run in the --python venv (NumPy, Pillow, h5py, torch, onnxruntime).
# ---------------------------------------------------------------------------------------------

def child_make_images(args):
    """Deterministic synthetic photographs: a mottled concrete-like texture with dark
    random-walk cracks of varying width, saved as JPEG (quality 92)."""
    import numpy as np
    from PIL import Image, ImageDraw, ImageFilter
    for spec in args.images:
        path, size = spec.rsplit("=", 1)
        w, h = (int(v) for v in size.split("x"))
        rng = np.random.default_rng(w * 100003 + h)
        pixels = np.array([150, 146, 138], np.float32) + rng.normal(0, 8, (h, w, 1))
        for cell, amplitude in ((96, 14), (12, 6)):  # blotches and grain, gray
            noise = rng.normal(128, 40, (max(h // cell, 2), max(w // cell, 2)))
            noise = Image.fromarray(np.clip(noise, 0, 255).astype(np.uint8)).resize((w, h),
                                                                                   Image.BICUBIC)
            pixels += amplitude / 40 * (np.asarray(noise, np.float32)[..., None] - 128)
        img = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
        draw = ImageDraw.Draw(img)
        cracks = max(4, round(w * h / 300_000))
        for _ in range(cracks):
            x, y = rng.uniform(0, w), rng.uniform(0, h)
            angle = rng.uniform(0, 2 * np.pi)
            points = [(x, y)]
            for _ in range(int(rng.integers(30, 80))):
                angle += rng.normal(0, 0.35)
                step = rng.uniform(0.01, 0.03) * min(w, h)
                x, y = x + step * np.cos(angle), y + step * np.sin(angle)
                points.append((x, y))
            shade = int(rng.integers(25, 70))
            draw.line(points, fill=(shade, shade, shade), width=int(rng.integers(2, 7)),
                      joint="curve")
        img = img.filter(ImageFilter.GaussianBlur(0.7))
        img.save(path, "JPEG", quality=92)


def read_rgb(path):
    import numpy as np
    from PIL import Image
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def write_mask(path, prob, threshold):
    import numpy as np
    from PIL import Image
    Image.fromarray(np.where(prob > np.float32(threshold), 255, 0).astype(np.uint8), "L").save(path)


def checkpoint_state(path, raw_weights):
    """(model name, width divisor, deconv, state_dict, normalisation mean/std) of a dptrain
    checkpoint; its averaged weights (/ema) where it has them, as dppredict."""
    import h5py
    import numpy as np
    import torch
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
    import models
    from torch_h5 import to_state_dict
    with h5py.File(path, "r") as f:
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        averaged = bool(int(attrs.get("has_averaged_weights", 0))) and not raw_weights
        tensors = {}
        for group in (("ema/params", "ema/buffers") if averaged else ("params", "buffers")):
            if group in f:
                for name, d in f[group].items():
                    tensors[name] = torch.from_numpy(np.asarray(d, dtype=np.float32))
    name, d = attrs["model"], int(attrs["width_divisor"])
    deconv = bool(int(attrs.get("deconv", 0)))
    model = models.make(name, width_divisor=d, is_deconv=deconv)
    sd = to_state_dict(model, name, tensors, step=int(attrs.get("step", 0)))
    mean, std = normalization(attrs)
    return model, sd, mean, std


def normalization(attrs):
    """The checkpoint's input statistics, as dp::app::normalization_of."""
    import h5py
    if "normalize_mean" in attrs and "normalize_std" in attrs:
        return ([float(v) for v in attrs["normalize_mean"]],
                [float(v) for v in attrs["normalize_std"]])
    options = str(attrs.get("options", ""))
    o = {}
    for line in options.splitlines():
        if " = " in line:
            k, v = line.split(" = ", 1)
            o[k.strip()] = v.strip()
    if "normalize_mean" in o and "normalize_std" in o:
        return ([float(v) for v in o["normalize_mean"].split()],
                [float(v) for v in o["normalize_std"].split()])
    if o.get("normalize", "imagenet") == "imagenet":
        return [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    with h5py.File(o.get("data", ""), "r") as f:  # older checkpoints: their dataset's statistics
        return list(f.attrs["mean"]), list(f.attrs["std"])


def normalization_lut(mean, std):
    """[3, 256] float32: (v / 255 - mean) / std in float32, the Loader's expression."""
    import numpy as np
    v = np.arange(256, dtype=np.float32) / np.float32(255)
    return np.stack([(v - np.float32(m)) / np.float32(s) for m, s in zip(mean, std)])


def make_torch_forward(args):
    import contextlib
    import numpy as np
    import torch
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    model, sd, mean, std = checkpoint_state(args.checkpoint, args.raw_weights)
    model.load_state_dict(sd, strict=True)
    model = model.eval().to(memory_format=torch.channels_last)
    lut = normalization_lut(mean, std)
    channel = np.arange(3)

    def forward(tiles):
        x = torch.from_numpy(lut[channel, tiles])  # [n, th, tw, 3] float32
        x = x.permute(0, 3, 1, 2)  # NCHW with channels_last strides, no copy
        cast = (torch.autocast("cpu", dtype=torch.bfloat16) if args.precision == "bf16"
                else contextlib.nullcontext())
        with torch.inference_mode(), cast:
            logits = model(x)
        return logits[:, 0].float().numpy()

    return forward, {"torch": torch.__version__,
                     "aten_cpu_capability": torch.backends.cpu.get_cpu_capability()}


def make_ort_forward(args):
    import numpy as np
    import onnxruntime as ort
    if args.precision != "fp32":
        raise SystemExit("ONNX Runtime runs fp32 only here")
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(args.onnx, so, providers=["CPUExecutionProvider"])

    def forward(tiles):  # the model takes RGB pixels 0..255, NCHW
        x = np.ascontiguousarray(tiles.transpose(0, 3, 1, 2), dtype=np.float32)
        return session.run(["logits"], {"image": x})[0][:, 0]

    return forward, {"onnxruntime": ort.__version__}


def read_float_tiff(path):
    import numpy as np
    from PIL import Image
    with Image.open(path) as im:
        return np.asarray(im, dtype=np.float32)


def child_engine(args):
    """One engine, one photograph: warm-up, --repeats timed photographs, JSON on the last line."""
    import numpy as np
    forward, versions = (make_torch_forward if args.child == "torch" else make_ort_forward)(args)
    ready = time.time() - args.launched

    def photograph(out):
        t0 = time.perf_counter()
        prob = predict_tiled(read_rgb(args.image), forward, args.tile_h, args.tile_w,
                             args.overlap, args.batch)
        write_mask(out, prob, args.threshold)
        return time.perf_counter() - t0, prob

    out = os.path.join(args.out, os.path.splitext(os.path.basename(args.image))[0] + ".png")
    warmup, prob = photograph(out)
    result = dict(versions, ready_s=ready, warmup_s=warmup)
    if args.compare:
        ref = read_float_tiff(args.compare)
        diff = np.abs(prob - ref)
        control = predict_tiled(read_rgb(args.image), forward, args.tile_h, args.tile_w,
                                args.overlap, args.batch, flat=True)
        result.update(max_abs_diff=float(diff.max()), mean_abs_diff=float(diff.mean()),
                      control_max_abs_diff=float(np.abs(control - ref).max()),
                      prob_min=float(prob.min()), prob_max=float(prob.max()),
                      prob_std=float(prob.std()))
    result["seconds"] = [photograph(out)[0] for _ in range(args.repeats)]
    print(json.dumps(result))


def child_probe(args):
    """What PyTorch runs: its version, ATen's capability, oneDNN's ISA (ONEDNN_VERBOSE=1 is set
    by the parent, so oneDNN prints its info lines on the convolution here)."""
    import ctypes
    import onnxruntime as ort
    try:  # --engines dppredict ort needs no PyTorch
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        conv = torch.nn.Conv2d(32, 32, 3, padding=1).eval().to(memory_format=torch.channels_last)
        with torch.inference_mode():  # (8 channels run no oneDNN primitive in PyTorch 2.15)
            conv(torch.zeros(1, 32, 64, 64).to(memory_format=torch.channels_last))
    sys.stdout.flush()
    shim = getattr(ctypes.CDLL(None), "cpuid_cap_answered", None)
    print(json.dumps({"torch": torch.__version__ if torch else "not installed",
                      "onnxruntime": ort.__version__,
                      "aten_cpu_capability": torch.backends.cpu.get_cpu_capability() if torch
                      else "-",
                      "cpuid_answered": shim() if shim else None}))


# ---------------------------------------------------------------------------------------------
# The parent: standard library only.
# ---------------------------------------------------------------------------------------------

def run_measured(cmd, env):
    """Runs cmd; (wall seconds, peak RSS in bytes of it and its waited-for descendants,
    stdout, stderr). Raises SystemExit with its output when it fails."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        stdout = out.read().decode(errors="replace")
        stderr = err.read().decode(errors="replace")
    if p.returncode != 0:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{stdout}\n{stderr}")
    return wall, usage.ru_maxrss * 1024, stdout, stderr


def call(cmd, env=None):
    """Runs cmd to completion; its stdout, or SystemExit with its output when it fails."""
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    return p.stdout


def cpu_info():
    model, flags = "?", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and model == "?":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    return model, flags


def parse_size(text):
    m = re.fullmatch(r"(\d+)x(\d+)", text)
    if not m:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT, got '{text}'")
    return int(m.group(1)), int(m.group(2))


def make_checkpoint(args, work, env):
    """A checkpoint of a two-step dptrain run (UNet16 /8) on a synthetic dataset of
    --train-size (HxW), on one thread."""
    synth = os.path.join(work, "synth.h5")
    model_dir = os.path.join(work, "train")
    call([os.path.join(args.build, "app", "dpprep"), "synth", "--out", synth, "--train", "4",
          "--val", "2", "--size", args.train_size])
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    call(["mpirun", "-np", "1"] + root +
         [os.path.join(args.build, "app", "dptrain"), "--data", synth, "--width-divisor", "8",
          "--epochs", "1", "--max-steps", "2", "--batch-size", "2", "--threads", "1",
          "--model-dir", model_dir], env=dict(env, OMP_NUM_THREADS="1"))
    best = os.path.join(model_dir, "model_best.h5")
    if os.path.exists(best):
        return best
    epochs = sorted(f for f in os.listdir(model_dir) if re.fullmatch(r"model_epoch_\d+\.h5", f))
    if not epochs:
        raise SystemExit(f"dptrain wrote no checkpoint in {model_dir}")
    return os.path.join(model_dir, epochs[-1])


CPUID_CAPS = ("avx2", "avx512_core")  # what bench/cpuid_cap.c can hide down to


def peer_env(args, env):
    """The peers' environment: env, plus the CPUID shim where --isa asks for a cap it knows."""
    if args.isa not in CPUID_CAPS or args.engines == ["dppredict"]:
        return env
    shim = os.path.join(args.build, "bench", "libcpuid_cap.so")
    if not os.path.exists(shim):
        raise SystemExit(f"--isa {args.isa} caps the peers with {shim}: build the target "
                         "cpuid_cap (cmake --build build/default --target cpuid_cap)")
    return dict(env, LD_PRELOAD=shim, CPUID_CAP=args.isa)


def photo_folder(photo, n):
    """A folder beside `photo` holding n hard links to it (n photographs to dppredict)."""
    folder = os.path.splitext(photo)[0] + f"_x{n}"
    os.makedirs(folder, exist_ok=True)
    for i in range(n):
        link = os.path.join(folder, f"{i:03d}.jpg")
        if not os.path.exists(link):
            os.link(photo, link)
    return folder


class Bench:
    def __init__(self, args, work, env):
        self.args, self.env = args, env
        self.peer_env = peer_env(args, env)
        self.dppredict = os.path.join(args.build, "app", "dppredict")
        self.out = os.path.join(work, "out")
        os.makedirs(self.out, exist_ok=True)
        self.setup = None  # dppredict's tile, overlap, batch and ISA, from its start-up line

    def dppredict_cmd(self, image, precision, extra=()):
        cmd = [self.dppredict, "-c", self.args.checkpoint, "-o", self.out, "-q",
               "--threshold", str(self.args.threshold), "--precision", precision]
        if self.args.tile:
            cmd += ["--tile", self.args.tile]
        if self.args.overlap is not None:
            cmd += ["--overlap", str(self.args.overlap)]
        if self.args.cpu_conv:
            cmd += ["--cpu-conv", self.args.cpu_conv]
        return cmd + list(extra) + [image]

    def run_dppredict(self, image, threads, precision, extra=()):
        wall, rss, out, err = run_measured(self.dppredict_cmd(image, precision, extra),
                                           dict(self.env, OMP_NUM_THREADS=str(threads)))
        m = re.search(r"tiles (\d+)x(\d+), overlap (\d+)(?:, margin \d+)?, (\d+) per batch\b.*"
                      r"cpu \(oneDNN[^,]*, ([^)]*)\)", out + err)
        if not m:
            raise SystemExit(f"dppredict printed no start-up line:\n{out}\n{err}")
        self.setup = dict(tile_h=int(m.group(1)), tile_w=int(m.group(2)),
                          overlap=int(m.group(3)), batch=int(m.group(4)), isa=m.group(5))
        return wall, rss

    def dppredict_times(self, image, threads, precision):
        self.run_dppredict(image, threads, precision)  # warm-up: page cache, files
        runs = [self.run_dppredict(image, threads, precision) for _ in range(self.args.repeats)]
        return statistics.median(w for w, _ in runs), max(r for _, r in runs)

    def run_peer(self, engine, image, threads, precision, repeats, compare=None):
        s = self.setup
        cmd = [self.args.python, os.path.abspath(__file__), "--child", engine,
               "--image", image, "--threads", str(threads), "--precision", precision,
               "--repeats", str(repeats), "--tile-h", str(s["tile_h"]), "--tile-w",
               str(s["tile_w"]), "--overlap", str(s["overlap"]), "--batch", str(s["batch"]),
               "--threshold", str(self.args.threshold), "--checkpoint", self.args.checkpoint,
               "--onnx", self.args.onnx or "", "--out", self.out, "--launched",
               repr(time.time())]
        if compare:
            cmd += ["--compare", compare]
        if self.args.raw_weights:
            cmd.append("--raw-weights")
        _, rss, out, _ = run_measured(cmd, dict(self.peer_env, OMP_NUM_THREADS=str(threads)))
        return json.loads(out.strip().splitlines()[-1]), rss


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable,
                    help="the Python with torch, onnxruntime, pillow, numpy, h5py (the peers)")
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "default"))
    ap.add_argument("--checkpoint", help="dptrain checkpoint (default: a two-step dptrain run)")
    ap.add_argument("--train-size", default="192x256",
                    help="HxW of the synthetic training images when no --checkpoint is given")
    ap.add_argument("--sizes", nargs="+", type=parse_size,
                    default=[(3456, 2304), (1024, 768)], help="photographs, WIDTHxHEIGHT")
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--precision", nargs="+", choices=["fp32", "bf16"], default=["fp32", "bf16"],
                    help="bf16 runs only where the CPU has AVX512-BF16 or AMX")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--folder", type=int, default=0, metavar="N",
                    help="also time dppredict on a folder of N copies of each photograph (one "
                         "command, as an inspection run), per photograph")
    ap.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    ap.add_argument("--isa", choices=list(ISAS), default="native",
                    help="cap every engine's oneDNN (and ATen) ISA, as compare_pytorch.py")
    ap.add_argument("--tile", help="dppredict --tile HxW (default: the training size)")
    ap.add_argument("--overlap", type=int, help="dppredict --overlap (default: a quarter)")
    ap.add_argument("--cpu-conv", help="dppredict --cpu-conv (default: its own, shape; auto "
                    "times the candidate kernels at first use in every command)")
    ap.add_argument("--threshold", type=float, default=0.5, help="mask threshold, every engine")
    ap.add_argument("--raw-weights", action="store_true", help="as dppredict --raw-weights")
    ap.add_argument("--no-check", action="store_true", help="skip the agreement check")
    ap.add_argument("--check-only", action="store_true", help="the agreement check, no timing")
    ap.add_argument("--work", help="keep the photographs, model and outputs in this folder")
    # Children (run by the script itself in --python).
    ap.add_argument("--child", choices=["make-images", "probe", "torch", "ort"],
                    help=argparse.SUPPRESS)
    for name in ("--image", "--onnx", "--out", "--compare"):
        ap.add_argument(name, help=argparse.SUPPRESS)
    ap.add_argument("--images", nargs="*", help=argparse.SUPPRESS)
    for name in ("--tile-h", "--tile-w", "--batch"):
        ap.add_argument(name, type=int, help=argparse.SUPPRESS)
    ap.add_argument("--launched", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child == "make-images":
        return child_make_images(args)
    if args.child == "probe":
        return child_probe(args)
    if args.child in ("torch", "ort"):
        args.threads, args.precision = args.threads[0], args.precision[0]
        return child_engine(args)

    if args.work:
        os.makedirs(args.work, exist_ok=True)
        run(args, os.path.abspath(args.work))
    else:
        with tempfile.TemporaryDirectory(prefix="inference_bench.") as work:
            run(args, work)


def run(args, work):
    env = isa_env(args.isa)
    model, flags = cpu_info()
    bf16_cpu = bool(flags & {"avx512_bf16", "amx_bf16"})
    notes = []
    precisions = list(args.precision)
    if "bf16" in precisions and (not bf16_cpu or args.isa in ("avx2", "avx512_core")):
        precisions.remove("bf16")
        notes.append("bf16 skipped: " + ("the CPU has neither AVX512-BF16 nor AMX" if not bf16_cpu
                                         else f"--isa {args.isa} caps them away"))
    peers = [e for e in args.engines if e != "dppredict"]
    sizes = sorted(args.sizes, key=lambda s: -s[0] * s[1])

    if not args.checkpoint:
        args.checkpoint = make_checkpoint(args, work, env)
    args.checkpoint = os.path.abspath(args.checkpoint)
    args.onnx = None
    if "ort" in args.engines:
        args.onnx = os.path.join(work, "model.onnx")
        call([os.path.join(args.build, "app", "dpexport"), "-c", args.checkpoint, "-o",
              args.onnx] + (["--raw-weights"] if args.raw_weights else []))

    bench = Bench(args, work, env)
    probe_image = os.path.join(work, "probe.jpg")  # a small photograph for dppredict's set-up
    photos = {s: os.path.join(work, f"photo_{s[0]}x{s[1]}.jpg") for s in sizes}
    make = [args.python, os.path.abspath(__file__), "--child", "make-images", "--images"]
    call(make + [f"{probe_image}=64x64"])
    bench.run_dppredict(probe_image, 1, "fp32")  # tile, overlap, batch and ISA from its line
    s = bench.setup
    single = os.path.join(work, f"single_{s['tile_w']}x{s['tile_h']}.jpg")  # one tile
    call(make + [f"{p}={w}x{h}" for (w, h), p in photos.items()] +
         [f"{single}={s['tile_w']}x{s['tile_h']}"])

    versions = {}
    if peers:
        probe = call([args.python, os.path.abspath(__file__), "--child", "probe"],
                     env=dict(bench.peer_env, ONEDNN_VERBOSE="1", DNNL_VERBOSE="1",
                              OMP_NUM_THREADS="1"))
        versions = json.loads(probe.strip().splitlines()[-1])
        versions["onednn"] = verbose_isa(probe)

    # Agreement: the peers' fp32 probabilities of the smallest photograph against dppredict's.
    agreement = []
    if not args.no_check and peers:
        small = photos[sizes[-1]]
        bench.run_dppredict(small, args.threads[0], "fp32",
                            ["--save-prob", "--prob-format", "tiff32"])
        ref = os.path.join(bench.out, "prob", os.path.splitext(os.path.basename(small))[0] + ".tif")
        for engine in peers:
            r, _ = bench.run_peer(engine, small, args.threads[0], "fp32", 0, compare=ref)
            agreement.append((engine, r))

    rows = []
    startup = {}  # dppredict's whole command on a one-tile photograph, per (threads, precision)
    for size in [] if args.check_only else sizes:
        for threads in args.threads:
            for precision in precisions:
                mpx = size[0] * size[1] / 1e6
                case = dict(size=size, threads=threads, precision=precision)
                if "dppredict" in args.engines:
                    seconds, rss = bench.dppredict_times(photos[size], threads, precision)
                    if (threads, precision) not in startup:
                        startup[threads, precision] = bench.dppredict_times(single, threads,
                                                                            precision)[0]
                    row = dict(case, engine="dppredict", seconds=seconds, mpx_s=mpx / seconds,
                               rss=rss, startup=startup[threads, precision])
                    if args.folder > 1:
                        folder = photo_folder(photos[size], args.folder)
                        row["folder_seconds"] = bench.dppredict_times(
                            folder, threads, precision)[0] / args.folder
                    rows.append(row)
                for engine in peers:
                    if engine == "ort" and precision != "fp32":
                        continue
                    r, rss = bench.run_peer(engine, photos[size], threads, precision,
                                            args.repeats)
                    seconds = statistics.median(r["seconds"])
                    rows.append(dict(case, engine=engine, seconds=seconds, mpx_s=mpx / seconds,
                                     rss=rss, startup=r["ready_s"] + r["warmup_s"] - seconds))
                print(f"... {size[0]}x{size[1]}, {threads} thread(s), {precision}: done "
                      f"(load average {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)

    report(args, rows, agreement, versions, notes, model, flags, sizes, bench.setup)
    if any(r["max_abs_diff"] > AGREEMENT_TOLERANCE for _, r in agreement):
        sys.exit(1)


def report(args, rows, agreement, versions, notes, model, flags, sizes, s):
    def has(flag):
        return "yes" if flag in flags else "no"
    print(f"CPU: {model}, {os.cpu_count()} logical CPUs; AVX-512 {has('avx512f')}, "
          f"AVX512-BF16 {has('avx512_bf16')}, AMX {has('amx_bf16')}")
    line = (f"oneDNN ISA (--isa {args.isa}): dppredict {s['isa']} "
            f"(--cpu-conv {args.cpu_conv or 'shape, its default'})")
    if versions:
        line += f"; PyTorch {versions['onednn']}, ATen {versions['aten_cpu_capability']}; "
        if versions.get("cpuid_answered"):
            line += (f"both peers' CPUID capped at {args.isa} by bench/cpuid_cap.c "
                     f"({versions['cpuid_answered']} CPUID instructions answered in the probe)")
        else:
            line += "ONNX Runtime: MLAS (not capped)"
    print(line)
    if versions:
        print(f"PyTorch {versions['torch']}, ONNX Runtime {versions['onnxruntime']}")
    tiles = [len(tile_starts(h, s["tile_h"], s["overlap"])) *
             len(tile_starts(w, s["tile_w"], s["overlap"])) for w, h in sizes]
    print(f"checkpoint {args.checkpoint}: tiles {s['tile_h']}x{s['tile_w']} (HxW), overlap "
          f"{s['overlap']}, {s['batch']} tiles per forward pass; tiles per photograph: " +
          ", ".join(f"{w}x{h} {n}" for (w, h), n in zip(sizes, tiles)))
    for engine, r in agreement:
        ok = "ok" if r["max_abs_diff"] <= AGREEMENT_TOLERANCE else "FAILED"
        print(f"agreement, {sizes[-1][0]}x{sizes[-1][1]} fp32, {ENGINE_NAMES[engine]} against "
              f"dppredict: max |dp| {r['max_abs_diff']:.3g}, mean {r['mean_abs_diff']:.3g} "
              f"(tolerance {AGREEMENT_TOLERANCE:g}: {ok}); probabilities {r['prob_min']:.3f}.."
              f"{r['prob_max']:.3f}, sd {r['prob_std']:.3f}; control, a plain mean of the "
              f"tiles instead of the window: max |dp| {r['control_max_abs_diff']:.3g}")
    for n in notes:
        print("note:", n)
    if not rows:
        return
    print()
    print("| engine | size | threads | precision | seconds | Mpx/s | peak RSS MiB | start-up s "
          "| dppredict / best peer (Mpx/s) |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        ratio = ""
        if r["engine"] == "dppredict":
            peers_here = [p for p in rows if p["engine"] != "dppredict" and
                          all(p[k] == r[k] for k in ("size", "threads", "precision"))]
            best = max((p["mpx_s"] for p in peers_here), default=None)
            if best:
                net = r["seconds"] - r["startup"]
                ratio = f"{r['mpx_s'] / best:.2f}x"
                mpx = r["size"][0] * r["size"][1] / 1e6
                if net > 0:
                    ratio += f" ({mpx / net / best:.2f}x without start-up)"
                if "folder_seconds" in r:
                    ratio += (f"; a folder of {args.folder}: {mpx / r['folder_seconds']:.2f} "
                              f"Mpx/s, {mpx / r['folder_seconds'] / best:.2f}x")
                # Both cold: dppredict's command against the fastest peer process from its launch
                # to its first photograph's mask (start-up + one photograph).
                cold = min(p["startup"] + p["seconds"] for p in peers_here)
                ratio += f"; both from launch: {cold / r['seconds']:.2f}x"
        print(f"| {ENGINE_NAMES[r['engine']]} | {r['size'][0]}x{r['size'][1]} | "
              f"{r['threads']} | {r['precision']} | {r['seconds']:.3f} | {r['mpx_s']:.2f} | "
              f"{r['rss'] / 2**20:.0f} | {r['startup']:.2f} | {ratio} |")
    print()
    folder = (f" A folder of {args.folder}: one dppredict command on {args.folder} copies of the "
              f"photograph, its median time / {args.folder}." if args.folder > 1 else "")
    print(f"seconds: median of {args.repeats} after one warm-up. dppredict: the whole command "
          f"(start-up included); start-up: its whole command on a one-tile photograph.{folder} "
          f"Peers: one "
          f"photograph in a warm process (decode, tiling, network, blending, mask PNG); start-up: "
          f"imports, weights/session and the first photograph's extra time. Both from launch: the "
          f"fastest peer's process from its launch to its first mask (start-up + seconds) "
          f"against dppredict's whole command. Load average at the end "
          f"{os.getloadavg()[0]:.1f}.")


if __name__ == "__main__":
    main()
