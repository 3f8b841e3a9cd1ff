#!/usr/bin/env python3
"""Reference ODS / OIS / AP with a pixel tolerance (NumPy + SciPy), and the goldens dptrain's
ThresholdSweep is tested against (tests/golden/sweep_metrics.h5).

Run with Debian's packages: /usr/bin/python3 tools/reference/sweep_metrics.py [--out tests/golden]
(apt-get install python3-numpy python3-scipy python3-h5py). Independent of the C++ method: each
threshold is applied to the probability map, the tolerance is a binary dilation / maximum filter
with a disk footprint (scipy.ndimage), and precision and recall are counted directly.
Definitions (as dptrain documents them): crack where sigmoid(logit) >= t, t = k/100, k = 1..99;
a predicted pixel is right when a true crack pixel lies within Euclidean distance r; a true pixel
is found when a predicted pixel does; ODS = max over t of F on the dataset's counts (ties: the
highest t); OIS = mean over images of the image's best F (no true pixel: F 1 where nothing is
predicted, else 0); AP = sum over t from high to low of (R_t - R_previous) * P_t, P = 1 where
nothing is predicted.
"""
import argparse
import os

import h5py
import numpy as np
from scipy import ndimage

THRESHOLDS = [k / 100 for k in range(1, 100)]


def disk(r):
    y, x = np.mgrid[-r:r + 1, -r:r + 1]
    return (y * y + x * x) <= r * r


def counts(prob, truth, t, r):
    """(right predicted, predicted, found true, true) of one image at threshold t."""
    pred = prob >= t
    if r > 0:
        near_truth = ndimage.binary_dilation(truth, structure=disk(r))
        near_pred = ndimage.binary_dilation(pred, structure=disk(r))
    else:
        near_truth, near_pred = truth, pred
    return (int((pred & near_truth).sum()), int(pred.sum()), int((truth & near_pred).sum()),
            int(truth.sum()))


def f_measure(p, r):
    return 2 * p * r / (p + r) if p + r > 0 else 0.0


def sweep(probs, truths, r):
    per_t = np.zeros((len(THRESHOLDS), 4), dtype=np.int64)
    ois = 0.0
    for prob, truth in zip(probs, truths):
        best = 0.0
        for i, t in enumerate(THRESHOLDS):
            c = counts(prob, truth, t, r)
            per_t[i] += c
            if c[3] == 0:
                f = 1.0 if c[1] == 0 else 0.0
            else:
                f = f_measure(c[0] / c[1] if c[1] else 0.0, c[2] / c[3])
            best = max(best, f)
        ois += best
    precision = np.where(per_t[:, 1] > 0, per_t[:, 0] / np.maximum(per_t[:, 1], 1), 1.0)
    recall = per_t[:, 2] / per_t[:, 3] if per_t[0, 3] > 0 else np.zeros(len(THRESHOLDS))
    ods, ods_t, ap, previous = 0.0, 0.0, 0.0, 0.0
    for i in reversed(range(len(THRESHOLDS))):
        f = f_measure(precision[i], recall[i]) if recall[i] > 0 else 0.0
        if f > ods:
            ods, ods_t = f, THRESHOLDS[i]
        ap += (recall[i] - previous) * precision[i]
        previous = recall[i]
    return dict(ods=ods, ods_threshold=ods_t, ois=ois / len(probs), ap=ap), precision, recall


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "..", "tests", "golden"))
    args = ap.parse_args()
    rng = np.random.default_rng(1357)
    # 4 images of 24 x 20: thin random-walk cracks, logits that follow them with noise (a model
    # that is partly right), one image without cracks.
    n, h, w = 4, 24, 20
    truths = np.zeros((n, h, w), dtype=bool)
    for i in range(n - 1):
        y, x = rng.integers(0, h), 0
        while x < w:
            truths[i, y, x] = True
            y = int(np.clip(y + rng.integers(-1, 2), 0, h - 1))
            x += 1
    shifted = np.roll(truths, 1, axis=2)  # predictions a pixel off: what the tolerance forgives
    logits = (rng.normal(-2.0, 1.5, (n, h, w)) + 3.5 * shifted + 1.5 * truths).astype(np.float32)
    probs = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    path = os.path.join(args.out, "sweep_metrics.h5")
    with h5py.File(path, "w", libver="latest") as f:
        f.attrs["format"] = "dp-golden-v1"
        f.create_dataset("logits", data=logits)
        f.create_dataset("mask", data=truths.astype(np.float32))
        for r in (0, 1, 2):
            result, precision, recall = sweep(probs, truths, r)
            g = f.create_group(f"tolerance{r}")
            for k, v in result.items():
                g.attrs[k] = v
            g.create_dataset("precision", data=precision.astype(np.float32))
            g.create_dataset("recall", data=recall.astype(np.float32))
            print(f"tolerance {r}: " + ", ".join(f"{k} {v:.6f}" for k, v in result.items()))
    print(f"{path}: {os.path.getsize(path) / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
