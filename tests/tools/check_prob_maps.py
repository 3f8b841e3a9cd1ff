#!/usr/bin/env python3
"""Reads dppredict's probability and uncertainty files with Pillow and checks that they hold one map:
PNG16 / 65535, PNG8 / 255 and the float TIFF agree within their quantisation; the uncertainty
PNG16 is in range and not constant. Prints the largest differences; exits non-zero on a mismatch.
Usage: check_prob_maps.py PNG16_DIR PNG8_DIR TIFF_DIR UNCERTAINTY_DIR NAME...
"""
import sys

import numpy as np
from PIL import Image


def main():
    png16, png8, tiff, unc, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
    worst16 = worst8 = 0.0
    for name in names:
        p = np.asarray(Image.open(f"{tiff}/{name}.tif"), dtype=np.float64)
        a = np.asarray(Image.open(f"{png16}/{name}.png"), dtype=np.float64) / 65535
        b = np.asarray(Image.open(f"{png8}/{name}.png"), dtype=np.float64) / 255
        u = np.asarray(Image.open(f"{unc}/{name}.png"), dtype=np.float64) / 65535
        if not (p.shape == a.shape == b.shape == u.shape):
            sys.exit(f"{name}: shapes {p.shape} {a.shape} {b.shape} {u.shape}")
        if p.min() < 0 or p.max() > 1 or p.min() == p.max():
            sys.exit(f"{name}: float probabilities in [{p.min()}, {p.max()}]")
        worst16 = max(worst16, np.abs(a - p).max())
        worst8 = max(worst8, np.abs(b - p).max())
        if u.max() == u.min():
            sys.exit(f"{name}: constant uncertainty {u.max()}")
    print(f"png16 within {worst16:.3g} of the float map, png8 within {worst8:.3g}")
    if worst16 > 0.5 / 65535 + 1e-7 or worst8 > 0.5 / 255 + 1e-7:
        sys.exit("quantised maps differ from the float one by more than half a step")


if __name__ == "__main__":
    main()
