#!/usr/bin/env python3
"""Reference crack measurements (length and width per 8-connected crack) from scikit-image, SciPy and
NumPy, and the goldens dp::data::CrackMeasurer is tested against (tests/golden/crack_measure.h5).

Run in the virtual environment of tools/reference/cldice.py (the versions that wrote the file):
  /tmp/refvenv/bin/python tools/reference/crack_measure.py [--out tests/golden]
Compare dppredict's measurements.csv with the reference on the masks it measured (real photographs'
masks, which are never committed):
  /tmp/refvenv/bin/python tools/reference/crack_measure.py --check OUT/measurements.csv MASK... \
      [--min-crack-px N]
Independent of the C++ method: components are scipy.ndimage.label's (8-connected), skeletons
skimage.morphology.skeletonize's, distances scipy.ndimage.distance_transform_edt's, the step
counts NumPy array shifts. Definitions (as dptrain documents them, data/include/dp/crack_measure.hpp):
  a step joins two 8-adjacent skeleton pixels, except a diagonal pair that an orthogonal skeleton
  neighbour of both also joins; length = 0.980 orthogonal + 1.406 diagonal - 0.091 corners
  (Vossepoel and Smeulders 1982; a corner is a pixel with exactly two steps, not opposite);
  steps_length = orthogonal + sqrt(2) diagonal; width = 2 d - 0.5 at every skeleton pixel, d the
  distance to the nearest background pixel centre; mean, median (NumPy's) and max over the
  skeleton, the widest point the first skeleton pixel in raster order with the max.
Layout: measure/<case>/mask uint8 (H, W), cracks float32 (K, len(COLUMNS)), attribute min_crack_px;
distance/<case>/{mask uint8, distance float32} (H, W).
"""
import argparse
import csv
import os
import sys

import h5py
import numpy as np
import scipy
import skimage
from PIL import Image
from scipy import ndimage
from skimage.morphology import skeletonize

from cldice import line_at, random_truth, stroke

FORMAT = "dp-golden-v1"
COLUMNS = ["area_px", "box_x", "box_y", "box_width", "box_height", "skeleton_px", "length_px",
           "steps_length_px", "mean_width_px", "median_width_px", "max_width_px", "widest_x",
           "widest_y"]
ORTHOGONAL, DIAGONAL, CORNER = 0.980, 1.406, -0.091
# (dy, dx) of the 8 neighbours; opposite pairs are i and 7 - i.
NEIGHBOURS = [(-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1)]


def shifted(a, dy, dx):
    """b[y, x] = a[y + dy, x + dx], False outside."""
    p = np.pad(a, 1)
    return p[1 + dy:1 + dy + a.shape[0], 1 + dx:1 + dx + a.shape[1]]


def measure(mask, min_crack_px):
    mask = mask != 0
    labels, n = ndimage.label(mask, structure=np.ones((3, 3)))
    skel = skeletonize(mask)
    dist = ndimage.distance_transform_edt(mask) if (~mask).any() else np.full(mask.shape, np.inf)
    steps = []
    for dy, dx in NEIGHBOURS:
        s = skel & shifted(skel, dy, dx)
        if dy and dx:
            s &= ~shifted(skel, 0, dx) & ~shifted(skel, dy, 0)
        steps.append(s)
    count = sum(s.astype(int) for s in steps)
    opposite = np.zeros(mask.shape, bool)
    for i in range(4):
        opposite |= steps[i] & steps[7 - i]
    corner = skel & (count == 2) & ~opposite
    orth = sum(steps[i].astype(float) for i in (1, 3, 4, 6)) / 2
    diag = sum(steps[i].astype(float) for i in (0, 2, 5, 7)) / 2
    rows = []
    for k in range(1, n + 1):
        comp = labels == k
        area = int(comp.sum())
        if area < min_crack_px:
            continue
        ys, xs = np.nonzero(comp)
        on = skel & comp
        o, d, c = orth[on].sum(), diag[on].sum(), corner[on].sum()
        sy, sx = np.nonzero(on)
        w = 2 * dist[on].astype(np.float64) - 0.5
        if len(w):
            i = int(np.argmax(w))
            widths = [w.mean(), np.median(w), w[i], sx[i], sy[i]]
        else:
            widths = [0, 0, 0, xs.min(), ys.min()]
        rows.append([area, xs.min(), ys.min(), xs.max() - xs.min() + 1, ys.max() - ys.min() + 1,
                     int(on.sum()), ORTHOGONAL * o + DIAGONAL * d + CORNER * c,
                     o + np.sqrt(2) * d] + widths)
    return np.array(rows, dtype=np.float64).reshape(-1, len(COLUMNS))


def scaled(mask, k):
    return np.kron(mask, np.ones((k, k), dtype=bool))


def cases(rng):
    out = {}
    for angle in (0, 10, 22.5, 30, 45, 60, 80, 100):
        for w in (1, 3, 6, 11):
            out[f"line_w{w}_{angle}deg"] = (line_at((96, 96), angle, w, 70), 1)
    t = np.linspace(0.0, np.pi, 60)
    arc = list(zip(48 + 30 * np.sin(t) - 14, 12 + 70 * t / np.pi))
    out["curve_w4"] = (stroke((96, 96), arc, 4), 1)
    y_shape = stroke((96, 96), [(90, 48), (48, 48), (8, 12)], 5) | stroke(
        (96, 96), [(48, 48), (8, 84)], 3)
    out["branch_y"] = (y_shape, 1)
    out["branch_y_4x"] = (scaled(y_shape[::2, ::2], 4), 1)
    out["curve_4x"] = (scaled(stroke((48, 48), [(p[0] / 2, p[1] / 2) for p in arc], 3), 4), 1)
    yy, xx = np.mgrid[0:40, 0:56]
    out["blobs"] = ((((yy - 15) / 9.0) ** 2 + ((xx - 16) / 13.0) ** 2 <= 1) | (
        (yy - 24) ** 2 + (xx - 40) ** 2 <= 8**2), 1)
    border = np.zeros((40, 56), dtype=bool)
    border[0:5, :] = True
    border[:, 0:3] = True
    border |= stroke((40, 56), [(39, 10), (20, 55)], 3)
    out["border"] = (border, 1)
    out["empty"] = (np.zeros((20, 30), dtype=bool), 1)
    out["full"] = (np.ones((16, 24), dtype=bool), 1)
    out["noise_min5"] = (rng.random((64, 64)) < 0.2, 5)
    out["noise_smooth_min10"] = (ndimage.gaussian_filter(rng.normal(size=(80, 81)), 2.0) > 0.3, 10)
    for i in range(6):
        out[f"random_cracks_{i}"] = (random_truth(rng, (120, 150)), 4)
    out["single_pixel"] = (np.ones((1, 1), dtype=bool), 1)
    out["row_1x40"] = (rng.random((1, 40)) < 0.7, 1)
    return out


def check(csv_path, masks, min_crack_px):
    """Compares dppredict's measurements.csv with the reference on the masks, crack by crack."""
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    by_image = {}
    for r in rows:
        by_image.setdefault(r["image"], []).append(r)
    worst_len, worst_width, cracks = 0.0, 0.0, 0
    for path in masks:
        name = os.path.splitext(os.path.basename(path))[0]
        mine = by_image.get(name, [])
        mask = np.asarray(Image.open(path).convert("L")) > 127  # as dpprep's masks
        ref = measure(mask, min_crack_px)
        if len(ref) != len(mine):
            sys.exit(f"{path}: {len(ref)} reference cracks, {len(mine)} in {csv_path}")
        for r, m in zip(ref, mine):
            length = r[COLUMNS.index("length_px")]
            dl = abs(float(m["length_px"]) - length) / max(length, 1.0) * 100
            dw = max(abs(float(m[c]) - r[COLUMNS.index(c)]) for c in
                     ("mean_width_px", "median_width_px", "max_width_px"))
            worst_len, worst_width = max(worst_len, dl), max(worst_width, dw)
            cracks += 1
    print(f"{cracks} cracks in {len(masks)} masks: length within {worst_len:.4f} px per 100 px, "
          f"widths within {worst_width:.4f} px of the reference")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "..", "tests", "golden"))
    ap.add_argument("--check", nargs="+", metavar=("CSV", "MASK"))
    ap.add_argument("--min-crack-px", type=int, default=32, help="as given to dppredict")
    args = ap.parse_args()
    if args.check:
        check(args.check[0], args.check[1:], args.min_crack_px)
        return
    rng = np.random.default_rng(1982)
    path = os.path.join(args.out, "crack_measure.h5")
    with h5py.File(path, "w", libver=("v110", "v110")) as f:
        f.attrs["format"] = FORMAT
        f.attrs["skimage_version"] = skimage.__version__
        f.attrs["numpy_version"] = np.__version__
        f.attrs["scipy_version"] = scipy.__version__
        f.attrs["generator"] = "tools/reference/crack_measure.py"
        f.attrs["columns"] = ",".join(COLUMNS)
        opts = dict(compression="gzip", compression_opts=9)
        for name, (mask, min_px) in cases(rng).items():
            g = f.create_group(f"measure/{name}")
            rows = measure(mask, min_px)
            g.create_dataset("mask", data=mask.astype(np.uint8), **opts)
            g.attrs["min_crack_px"] = np.int64(min_px)
            g.create_dataset("cracks", data=rows.astype(np.float32))
            first = (f"length {rows[0, 6]:.2f} px, median width {rows[0, 9]:.2f} px"
                     if len(rows) else "")
            print(f"measure {name:20s} {mask.shape[0]:3d} x {mask.shape[1]:3d}: "
                  f"{len(rows):3d} crack(s) {first}")
        for name in ("border", "blobs", "noise_min5", "full"):
            mask = cases(np.random.default_rng(1982))[name][0]
            g = f.create_group(f"distance/{name}")
            d = (ndimage.distance_transform_edt(mask) if (~mask).any()
                 else np.full(mask.shape, np.inf))
            g.create_dataset("mask", data=mask.astype(np.uint8), **opts)
            g.create_dataset("distance", data=d.astype(np.float32), **opts)
    print(f"{path}: {os.path.getsize(path) / 1024:.0f} KiB (scikit-image {skimage.__version__})")


if __name__ == "__main__":
    main()
