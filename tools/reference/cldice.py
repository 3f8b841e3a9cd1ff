#!/usr/bin/env python3
"""Reference skeletons and clDice (centreline Dice, Shit et al., CVPR 2021) from scikit-image and
NumPy, and the goldens dptrain's skeletonize and CenterlineDice are tested against
(tests/golden/cldice.h5).

Run in a virtual environment with PyPI's packages (the versions that wrote the committed file):
  python3 -m venv /tmp/refvenv
  /tmp/refvenv/bin/pip install scikit-image==0.26.0 numpy==2.4.6 scipy==1.17.1 h5py==3.16.0
  /tmp/refvenv/bin/python tools/reference/cldice.py [--out tests/golden]
Independent of the C++ method: skeletons are skimage.morphology.skeletonize's (method 'zhang',
the default for 2-D images), the counts are NumPy sums.
Definitions (as dptrain documents them): P = probability >= threshold (compared in float64), L =
the true mask, S() the skeleton; counts |S(P)|, |S(P) & L|, |S(L)|, |S(L) & P|, summed over the
images of a case; Tprec = |S(P) & L| / |S(P)| (1 when S(P) is empty), Tsens = |S(L) & P| / |S(L)|
(1 when S(L) is empty), clDice = 2 Tprec Tsens / (Tprec + Tsens) (0 when Tprec + Tsens = 0).
Layout: skeleton/<case>/{mask,skeleton} uint8 (H, W); cldice/<case>/{probability float32,
mask uint8} (N, H, W), threshold float64 (scalar), counts int64 (4), {cldice, precision,
sensitivity} float64 (scalar).
"""
import argparse
import os

import h5py
import numpy as np
import scipy
import skimage
from scipy import ndimage
from skimage.morphology import skeletonize

FORMAT = "dp-golden-v1"


def segment_distance(shape, p, q):
    """Euclidean distance of every pixel centre (row, col) to the segment p-q (row, col)."""
    y, x = np.mgrid[0:shape[0], 0:shape[1]].astype(np.float64)
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    d = q - p
    t = np.clip(((y - p[0]) * d[0] + (x - p[1]) * d[1]) / max(d @ d, 1e-12), 0.0, 1.0)
    return np.hypot(y - (p[0] + t * d[0]), x - (p[1] + t * d[1]))


def stroke(shape, points, width):
    """A polyline through `points` (row, col): width 1 is a sampled, rounded (8-connected) line;
    wider strokes are the pixels within width / 2 of it."""
    m = np.zeros(shape, dtype=bool)
    for p, q in zip(points[:-1], points[1:]):
        if width == 1:
            n = int(np.ceil(np.abs(np.subtract(q, p)).max())) + 1
            for t in np.linspace(0.0, 1.0, n):
                r = int(round(p[0] + t * (q[0] - p[0])))
                c = int(round(p[1] + t * (q[1] - p[1])))
                if 0 <= r < shape[0] and 0 <= c < shape[1]:
                    m[r, c] = True
        else:
            m |= segment_distance(shape, p, q) <= width / 2.0
    return m


def line_at(shape, angle_deg, width, length):
    """A straight stroke through the image centre at `angle_deg` (0: along a row)."""
    cy, cx = (shape[0] - 1) / 2.0, (shape[1] - 1) / 2.0
    a = np.deg2rad(angle_deg)
    dy, dx = -np.sin(a) * length / 2.0, np.cos(a) * length / 2.0
    return stroke(shape, [(cy - dy, cx - dx), (cy + dy, cx + dx)], width)


def skeleton_cases(rng):
    cases = {}
    s = (37, 53)
    cases["line_w1_row"] = stroke(s, [(18, 4), (18, 48)], 1)
    for w in (1, 3, 5):
        for angle in (30, 45, 100):
            cases[f"line_w{w}_{angle}deg"] = line_at((64, 64), angle, w, 50)
    t = np.linspace(0.0, np.pi, 40)
    arc = list(zip(32 + 22 * np.sin(t) - 10, 10 + 44 * t / np.pi))
    cases["curve_w4"] = stroke((64, 64), arc, 4)
    cases["branch_y_w3"] = stroke((64, 64), [(60, 32), (32, 32), (6, 8)], 3) | stroke(
        (64, 64), [(32, 32), (6, 56)], 3)
    y, x = np.mgrid[0:s[0], 0:s[1]]
    cases["blobs"] = (((y - 15) / 9.0) ** 2 + ((x - 16) / 13.0) ** 2 <= 1) | (
        (y - 24) ** 2 + (x - 40) ** 2 <= 8**2)
    border = np.zeros(s, dtype=bool)
    border[0:5, :] = True  # a band along the top row, full width
    border[:, 0:3] = True  # and one down the left column
    border |= stroke(s, [(36, 10), (20, 52)], 3)  # to the bottom and right borders
    cases["border_strokes"] = border
    cases["empty"] = np.zeros((20, 30), dtype=bool)
    cases["full"] = np.ones((16, 24), dtype=bool)
    cases["noise_half"] = rng.random(s) < 0.5
    cases["noise_sparse"] = rng.random((64, 64)) < 0.15
    cases["noise_smooth"] = ndimage.gaussian_filter(rng.normal(size=(40, 41)), 2.0) > 0.1
    cases["row_1x40"] = rng.random((1, 40)) < 0.7
    cases["column_40x1"] = rng.random((40, 1)) < 0.7
    cases["single_pixel"] = np.ones((1, 1), dtype=bool)
    cases["two_rows_full"] = np.ones((2, 17), dtype=bool)
    return cases


def cldice_counts(prob, truth, threshold):
    """The four counts of one case: images (N, H, W) summed."""
    c = np.zeros(4, dtype=np.int64)
    for p_img, l_img in zip(prob, truth):
        pred = p_img.astype(np.float64) >= threshold
        true = l_img != 0
        sp, sl = skeletonize(pred), skeletonize(true)
        c += [sp.sum(), (sp & true).sum(), sl.sum(), (sl & pred).sum()]
    return c


def cldice_value(c):
    tprec = c[1] / c[0] if c[0] > 0 else 1.0
    tsens = c[3] / c[2] if c[2] > 0 else 1.0
    value = 2 * tprec * tsens / (tprec + tsens) if tprec + tsens > 0 else 0.0
    return float(value), float(tprec), float(tsens)


def random_truth(rng, shape):
    """Crack-like truth: 1-2 random polylines of width 1-5."""
    m = np.zeros(shape, dtype=bool)
    for _ in range(rng.integers(1, 3)):
        pts = [(rng.uniform(0, shape[0]), rng.uniform(0, shape[1])) for _ in range(3)]
        m |= stroke(shape, pts, int(rng.integers(1, 6)))
    return m


def cldice_cases(rng):
    n, h, w = 4, 48, 56
    truth = np.stack([random_truth(rng, (h, w)) for _ in range(n)])
    # A model that is partly right: the truth blurred, a pixel off, plus noise and a false crack.
    blurred = np.stack([ndimage.gaussian_filter(np.roll(t.astype(np.float64), 1, axis=1), 1.0)
                        for t in truth])
    false_crack = np.stack([stroke((h, w), [(5, 5), (40, 50)], 2) if i % 2 else
                            np.zeros((h, w), dtype=bool) for i in range(n)])
    prob = np.clip(1.6 * blurred + 0.5 * false_crack + rng.normal(0.0, 0.12, (n, h, w)), 0, 1)
    prob = (np.round(prob * 256) / 256).astype(np.float32)  # k / 256: ties with t = 0.5 occur
    cases = {
        "partial_t0.3": (prob, truth, 0.3),
        "partial_t0.5": (prob, truth, 0.5),
        "partial_t0.7": (prob, truth, 0.7),
        "perfect": (truth.astype(np.float32), truth, 0.5),
    }
    shifted = np.roll(truth[:2], 8, axis=2)  # wider than the strokes: no overlap
    shifted[:, :, :8] = False
    cases["shifted_8px"] = (shifted.astype(np.float32), truth[:2], 0.5)
    fp = np.zeros((2, 20, 24), dtype=np.float32)
    fp[1, 4:7, 2:20] = 0.9
    cases["no_truth"] = (fp, np.zeros((2, 20, 24), dtype=bool), 0.5)
    cases["nothing"] = (np.zeros((3, 9, 11), dtype=np.float32), np.zeros((3, 9, 11), bool), 0.5)
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "..", "tests", "golden"))
    args = ap.parse_args()
    rng = np.random.default_rng(2021)
    path = os.path.join(args.out, "cldice.h5")
    # HDF5 1.10's file format: Debian 12's libhdf5 1.10 reads it (pip's h5py bundles 1.14, whose
    # "latest" it cannot), and one-chunk datasets need no chunk B-tree (a small file).
    with h5py.File(path, "w", libver=("v110", "v110")) as f:
        f.attrs["format"] = FORMAT
        f.attrs["skimage_version"] = skimage.__version__
        f.attrs["numpy_version"] = np.__version__
        f.attrs["scipy_version"] = scipy.__version__
        f.attrs["generator"] = "tools/reference/cldice.py"
        opts = dict(compression="gzip", compression_opts=9)
        for name, mask in skeleton_cases(rng).items():
            g = f.create_group(f"skeleton/{name}")
            skel = skeletonize(mask)
            g.create_dataset("mask", data=mask.astype(np.uint8), **opts)
            g.create_dataset("skeleton", data=skel.astype(np.uint8), **opts)
            print(f"skeleton {name:16s} {mask.shape[0]:3d} x {mask.shape[1]:3d}: "
                  f"{int(mask.sum()):5d} -> {int(skel.sum()):4d} pixels")
        for name, (prob, truth, threshold) in cldice_cases(rng).items():
            g = f.create_group(f"cldice/{name}")
            c = cldice_counts(prob, truth, threshold)
            value, tprec, tsens = cldice_value(c)
            g.create_dataset("probability", data=prob.astype(np.float32), **opts)
            g.create_dataset("mask", data=truth.astype(np.uint8), **opts)
            g.create_dataset("threshold", data=np.float64(threshold))
            g.create_dataset("counts", data=c.astype(np.int64))
            g.create_dataset("cldice", data=np.float64(value))
            g.create_dataset("precision", data=np.float64(tprec))
            g.create_dataset("sensitivity", data=np.float64(tsens))
            print(f"cldice {name:13s} t {threshold}: counts {c.tolist()}, Tprec {tprec:.6f}, "
                  f"Tsens {tsens:.6f}, clDice {value:.6f}")
    print(f"{path}: {os.path.getsize(path) / 1024:.0f} KiB (scikit-image {skimage.__version__})")


if __name__ == "__main__":
    main()
