#!/usr/bin/env python3
"""Turns a public crack dataset's checkout into image/mask folders for `dpprep build`.

  crack_datasets.py crackforest SRC OUT [--train N]

CrackForest (github.com/cuilimeng/CrackForest-dataset; research use only, never commit its
files): SRC/image/NNN.jpg and SRC/groundTruth/NNN.mat (MATLAB struct groundTruth.Segmentation,
1 background, 2 crack). Writes OUT/train/{images,masks} and OUT/val/{images,masks}: the first N
annotated images by name train (default 72, the usual 72/46 split), the rest validate; masks as
8-bit PNG (0, 255). Images are linked, not copied. Needs numpy and scipy (python3-scipy).
"""
import argparse
import os
import struct
import sys
import zlib

import numpy as np
import scipy.io


def write_png_gray(path, a):
    """An 8-bit greyscale PNG of a 2-D uint8 array (zlib, no filters)."""
    h, w = a.shape
    raw = b"".join(b"\x00" + a[y].tobytes() for y in range(h))

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)

    with open(path + ".tmp", "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
    os.replace(path + ".tmp", path)


def crackforest(src, out, train):
    stems = sorted(os.path.splitext(f)[0] for f in os.listdir(os.path.join(src, "groundTruth"))
                   if f.endswith(".mat"))
    stems = [s for s in stems if os.path.exists(os.path.join(src, "image", s + ".jpg"))]
    if len(stems) <= train:
        sys.exit(f"crack_datasets: {src}: {len(stems)} annotated images, need more than {train}")
    crack = 0
    for i, stem in enumerate(stems):
        split = "train" if i < train else "val"
        for sub in ("images", "masks"):
            os.makedirs(os.path.join(out, split, sub), exist_ok=True)
        seg = scipy.io.loadmat(os.path.join(src, "groundTruth", stem + ".mat"))["groundTruth"][0, 0]
        mask = np.where(seg["Segmentation"] == 2, 255, 0).astype(np.uint8)
        crack += int((mask > 0).sum())
        write_png_gray(os.path.join(out, split, "masks", stem + ".png"), mask)
        link = os.path.join(out, split, "images", stem + ".jpg")
        if not os.path.lexists(link):
            os.symlink(os.path.abspath(os.path.join(src, "image", stem + ".jpg")), link)
    pixels = len(stems) * mask.size
    print(f"crackforest: {train} train, {len(stems) - train} val images of "
          f"{mask.shape[1]}x{mask.shape[0]}, {100.0 * crack / pixels:.2f}% crack pixels -> {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset", choices=["crackforest"])
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--train", type=int, default=72)
    a = ap.parse_args()
    crackforest(a.src, a.out, a.train)


if __name__ == "__main__":
    main()
