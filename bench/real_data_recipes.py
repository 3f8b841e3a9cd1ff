#!/usr/bin/env python3
"""Trains crack-segmentation recipes on real photographs and scores each run (docs/real-data.md).

  real_data_recipes.py --data D.h5 [--test T.h5] --recipe NAME [--seeds 42 7] --out DIR
  (DP_BIN: the folder of dptrain and dppredict; default build/default/app)

Each recipe is a list of dptrain options on top of the fixed comparison settings (UNet16 at
width 1/8, 15 epochs, 2 ranks x batch 4, one thread per rank); --seed is the only other option
that changes. Per run it prints the dptrain command, then one row per epoch from metrics.csv and
a summary: the epochs with IoU@0.5 = 0 after epoch 2, best ODS and AP, the spread of IoU@0.5 over
the last 5 epochs, and, with --test (the held-out split as the `val` split of T.h5), dppredict's
scores of model_best.h5 at its default threshold (--threshold auto). Standard library only; the
datasets are fetched and built as docs/real-data.md says (never committed).

A recipe is one of RECIPES (the runs of the earlier sections) or words joined by '-', each adding
options: sqrt / none (--pos-weight), ema (--ema 0.99), emaw (--ema 0.99 --ema-warmup), emaNN and
emawNN (the same at decay 0.NN), cosine
(--lr-schedule cosine), adamw (--optimizer adamw, with cosine unless const or drop follows),
const (a constant LR), drop (x0.1 from epoch 11: --lr-schedule step --lr-step 10 --lr-gamma 0.1),
lrN (--lr 0.00N), clipN (--clip-grad-norm N), warm (--warmup-epochs 1), wsN (--warmup-steps N), ods (--best-metric ods),
cool (--lr-schedule cooldown), coolN (cooldown with --cooldown-epochs N),
det (--deterministic: direct convolution kernels, so that a seed is one run), dnorm (--normalize
dataset: the file's own mean and std instead of ImageNet's), sgd (the default
until 2026-12-03: --optimizer sgd --lr-schedule step), bcecl / dicecl / bcedicecl (--loss
bce+cldice / dice+cldice / bce+dice+cldice; a suffix wN sets --cldice-weight N/10, iN
--cldice-iterations N, sN --cldice-start-epoch N: bcediceclw3s4);
e.g. sqrt-ema-adamw-lr2.
"""
import argparse
import csv
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.environ.get("DP_BIN", os.path.join(HERE, "..", "build", "default", "app"))
FIXED = ["--width-divisor", "8", "--epochs", "15", "--batch-size", "4", "--threads", "1"]
RECIPES = {
    "default": [],
    "old": ["--loss", "bce", "--pos-weight", "none"],
    "ema": ["--ema", "0.99"],
    "ema-ods": ["--ema", "0.99", "--best-metric", "ods"],
    "ods": ["--best-metric", "ods"],
    "cosine-ods": ["--lr-schedule", "cosine", "--warmup-epochs", "1", "--best-metric", "ods"],
    "ema-cosine-ods": ["--ema", "0.99", "--lr-schedule", "cosine", "--warmup-epochs", "1",
                       "--best-metric", "ods"],
}


WORDS = {
    "sqrt": ["--pos-weight", "sqrt"],
    "none": ["--pos-weight", "none"],
    "ema": ["--ema", "0.99"],
    "emaw": ["--ema", "0.99", "--ema-warmup"],
    "cosine": ["--lr-schedule", "cosine"],
    "warm": ["--warmup-epochs", "1"],
    "drop": ["--lr-schedule", "step", "--lr-step", "10", "--lr-gamma", "0.1"],
    "ods": ["--best-metric", "ods"],
    "det": ["--deterministic"],
    "dnorm": ["--normalize", "dataset"],
    "sgd": ["--optimizer", "sgd", "--lr-schedule", "step"],
}


def recipe_options(name):
    """dptrain options of a recipe: a RECIPES entry, or the words of a composed name."""
    if name in RECIPES:
        return RECIPES[name]
    words = name.split("-")
    options = []
    for w in words:
        if w in WORDS:
            options += WORDS[w]
        elif w == "adamw":
            options += ["--optimizer", "adamw"]
            if not {"const", "cosine", "drop"} & set(words):
                options += WORDS["cosine"]
        elif w.startswith("ws") and w[2:].isdigit():
            options += ["--warmup-steps", w[2:]]
        elif w == "cool" or (w.startswith("cool") and w[4:].isdigit()):
            options += ["--lr-schedule", "cooldown"]
            if w[4:]:
                options += ["--cooldown-epochs", w[4:]]
        elif re.fullmatch(r"emaw?\d\d", w):
            options += ["--ema", f"0.{w[-2:]}"] + (["--ema-warmup"] if w[3] == "w" else [])
        elif re.fullmatch(r"(bce|dice|bcedice)cl(w\d+)?(i\d+)?(s\d+)?", w):
            # bcecl / dicecl / bcedicecl: --loss with soft clDice; wN: --cldice-weight 0.N (w10:
            # 1.0), iN: --cldice-iterations N, sN: --cldice-start-epoch N
            m = re.fullmatch(r"(bce|dice|bcedice)cl(?:w(\d+))?(?:i(\d+))?(?:s(\d+))?", w)
            options += ["--loss", {"bce": "bce+cldice", "dice": "dice+cldice",
                                   "bcedice": "bce+dice+cldice"}[m[1]]]
            if m[2]:
                options += ["--cldice-weight", str(int(m[2]) / 10)]
            if m[3]:
                options += ["--cldice-iterations", m[3]]
            if m[4]:
                options += ["--cldice-start-epoch", m[4]]
        elif w.startswith("clip") and w[4:].isdigit():
            options += ["--clip-grad-norm", w[4:]]
        elif w.startswith("lr") and w[2:].isdigit():
            options += ["--lr", f"0.00{w[2:]}"]
        elif w != "const":
            raise argparse.ArgumentTypeError(f"unknown recipe word '{w}' in '{name}'")
    return options


def run(cmd, log):
    print("$ " + " ".join(cmd), flush=True)
    with open(log, "w") as f:
        status = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    if status != 0:
        sys.exit(f"exit {status}; see {log}")
    with open(log) as f:
        return f.read()


def num(row, key):
    v = row.get(key, "")
    return float(v) if v not in ("", None) else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--test", help="dataset whose val split is the held-out test split")
    ap.add_argument("--recipe", required=True, type=lambda n: (recipe_options(n), n)[1],
                    help="a RECIPES name or composed words (see above)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[42, 7])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tolerance", default="2",
                    help="pixels: the ODS/OIS/AP tolerance of dptrain's validation and of the test")
    ap.add_argument("--train-tolerance",
                    help="dptrain's --tolerance where it differs from the test's (0 is its "
                         "default: the recorded threshold is then the pixel-exact best F)")
    a = ap.parse_args()
    train_tolerance = a.train_tolerance if a.train_tolerance is not None else a.tolerance
    for seed in a.seeds:
        model_dir = os.path.join(a.out, f"{a.recipe}-s{seed}")
        os.makedirs(model_dir, exist_ok=True)
        cmd = ["mpirun", "--allow-run-as-root", "-np", "2", os.path.join(BUILD, "dptrain"),
               "--data", a.data, *FIXED, "--tolerance", train_tolerance, "--seed", str(seed),
               "--model-dir", model_dir, "--resume", "never", "--progress", "lines",
               *recipe_options(a.recipe)]
        run(cmd, os.path.join(model_dir, "train.log"))
        with open(os.path.join(model_dir, "metrics.csv")) as f:
            rows = list(csv.DictReader(f))
        print(f"| epoch | iou@0.5 | ods | t | ap | iou@t | cldice | valid_loss | s |")
        for r in rows:
            print(f"| {r['epoch']} | {num(r, 'iou'):.3f} | {num(r, 'ods'):.3f} | "
                  f"{num(r, 'ods_threshold'):.2f} | {num(r, 'ap'):.3f} | "
                  f"{num(r, 'iou_at_ods'):.3f} | {num(r, 'cldice'):.3f} | "
                  f"{num(r, 'valid_loss'):.4f} | {num(r, 'seconds'):.0f} |")
        zero = [int(r["epoch"]) for r in rows if int(r["epoch"]) > 2 and num(r, "iou") == 0]
        last = [num(r, "iou") for r in rows[-5:]]
        summary = (f"summary {a.recipe} seed {seed}: IoU@0.5=0 after epoch 2: {zero or 'none'}; "
                   f"best ODS {max(num(r, 'ods') for r in rows):.3f}; "
                   f"best AP {max(num(r, 'ap') for r in rows):.3f}; "
                   f"IoU@0.5 spread, last 5: {max(last) - min(last):.3f}; "
                   f"mean epoch {sum(num(r, 'seconds') for r in rows) / len(rows):.1f} s")
        if a.test:
            out = run(["mpirun", "--allow-run-as-root", "-np", "2",
                       os.path.join(BUILD, "dppredict"), "-c",
                       os.path.join(model_dir, "model_best.h5"), "--dataset", a.test,
                       "--split", "val", "--tolerance", a.tolerance, "-q"],
                      os.path.join(model_dir, "test.log"))
            m = re.search(r"threshold ([0-9.]+)\): iou ([0-9.]+)  dice ([0-9.]+)  precision "
                          r"([0-9.]+)  recall ([0-9.]+)  cldice ([0-9.]+).*ods ([0-9.]+)", out)
            best = re.search(r"trained (\d+) epoch", out)
            if m:
                summary += (f"; test (model_best.h5, epoch {best.group(1) if best else '?'}, "
                            f"threshold {m.group(1)}): IoU {float(m.group(2)):.3f} Dice "
                            f"{float(m.group(3)):.3f} P {float(m.group(4)):.3f} R "
                            f"{float(m.group(5)):.3f} clDice {float(m.group(6)):.3f} ODS "
                            f"{float(m.group(7)):.3f}")
        print(summary, flush=True)


if __name__ == "__main__":
    main()
