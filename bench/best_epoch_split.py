#!/usr/bin/env python3
"""Split-half test of best-epoch rules: is the best validation epoch a lucky one (docs/real-data.md)?

  best_epoch_split.py --data D.h5 --run DIR [--run DIR ...] [--splits 200] [--windows 1 2 3 4]
  (DP_BIN: the folder of dppredict; default build/default/app)

Each DIR is a dptrain model folder with every model_epoch_<E>.h5 kept. Every epoch checkpoint is
scored once on the validation split of D.h5 at its recorded threshold (`dppredict --dataset D.h5
--split val --per-image`, cached beside the run as best_epoch_split/epoch_<E>.csv). Then, --splits
times, the validation photographs are split at random into halves A and B; each rule picks an
epoch by pooled IoU on A (the best single epoch, the best mean over a window of N validations
ending at the epoch, or the last epoch) and that epoch is scored on B. Prints, per run and rule,
the mean IoU on B and the median epoch picked. Standard library only.
"""
import argparse
import csv
import os
import random
import statistics
import subprocess
import sys


def score_epochs(dppredict, data, run):
    cache = os.path.join(run, "best_epoch_split")
    os.makedirs(cache, exist_ok=True)
    epochs = sorted(int(f[len("model_epoch_"):-3]) for f in os.listdir(run)
                    if f.startswith("model_epoch_") and f.endswith(".h5"))
    if not epochs:
        sys.exit(f"best_epoch_split: error: no model_epoch_<E>.h5 in {run}")
    counts = {}
    for e in epochs:
        csv_path = os.path.join(cache, f"epoch_{e}.csv")
        if not os.path.exists(csv_path):
            subprocess.run([dppredict, "-c", os.path.join(run, f"model_epoch_{e}.h5"), "--dataset",
                            data, "--split", "val", "--per-image", csv_path + ".tmp",
                            "--min-crack-px", "1", "-o", os.path.join(cache, "out")],
                           check=True, stdout=subprocess.DEVNULL)
            os.replace(csv_path + ".tmp", csv_path)
        with open(csv_path) as f:
            counts[e] = [(int(r["tp_px"]), int(r["fp_px"]), int(r["fn_px"]))
                         for r in csv.DictReader(f)]
    return counts


def pooled_iou(rows, idx):
    tp = sum(rows[i][0] for i in idx)
    fp = sum(rows[i][1] for i in idx)
    fn = sum(rows[i][2] for i in idx)
    return tp / max(1, tp + fp + fn)


def pick(scores, window):
    """The epoch whose mean score over it and the window - 1 epochs before it is the highest;
    window 0: the last epoch."""
    epochs = sorted(scores)
    if window == 0:
        return epochs[-1]
    def mean_at(e):
        win = [scores[k] for k in epochs if e - window < k <= e]
        return sum(win) / len(win)
    return max(epochs, key=lambda e: (mean_at(e), -e))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--run", action="append", required=True)
    ap.add_argument("--splits", type=int, default=200)
    ap.add_argument("--windows", type=int, nargs="+", default=[1, 2, 3, 4])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    dppredict = os.path.join(os.environ.get("DP_BIN", "build/default/app"), "dppredict")
    rules = [(f"mean of {w}" if w > 1 else "best epoch", w) for w in a.windows] + [("last", 0)]
    rng = random.Random(a.seed)
    means = {name: [] for name, _ in rules}
    for run in a.run:
        counts = score_epochs(dppredict, a.data, run)
        n = len(next(iter(counts.values())))
        got = {name: ([], []) for name, _ in rules}
        for _ in range(a.splits):
            idx = list(range(n))
            rng.shuffle(idx)
            half_a, half_b = idx[:n // 2], idx[n // 2:]
            on_a = {e: pooled_iou(rows, half_a) for e, rows in counts.items()}
            for name, w in rules:
                e = pick(on_a, w)
                got[name][0].append(pooled_iou(counts[e], half_b))
                got[name][1].append(e)
        print(run + ": " + ", ".join(
            f"{name} {statistics.mean(v):.4f} (epoch {statistics.median(es):.0f})"
            for name, (v, es) in got.items()))
        for name in means:
            means[name].append(statistics.mean(got[name][0]))
    print("mean over runs: " + ", ".join(f"{k} {statistics.mean(v):.4f}" for k, v in means.items()))


if __name__ == "__main__":
    main()
