#!/usr/bin/env python3
"""Turns a public crack dataset's checkout into image/mask folders for `dpprep build`.

  crack_datasets.py crackforest SRC OUT [--train N]
  crack_datasets.py deepcrack SRC OUT [--val N] [--seed S]

CrackForest (github.com/cuilimeng/CrackForest-dataset; research use only, never commit its
files): SRC/image/NNN.jpg and SRC/groundTruth/NNN.mat (MATLAB struct groundTruth.Segmentation,
1 background, 2 crack). Writes OUT/train/{images,masks} and OUT/val/{images,masks}: the first N
annotated images by name train (default 72, the usual 72/46 split), the rest validate; masks as
8-bit PNG (0, 255). Images are linked, not copied. Needs numpy and scipy (python3-scipy).

DeepCrack (Liu et al., Neurocomputing 2019; github.com/yhlleo/DeepCrack, dataset/DeepCrack.zip;
the unpacked folders are also in github.com/jklimack/CrackSegmentation under DeepCrack/;
non-commercial research and education only, never commit its files): SRC/{train,test}_img/STEM.jpg
with SRC/{train,test}_lab/STEM.png, 300 training and 237 test images of 544x384. Writes
OUT/train/{images,masks} and OUT/val/{images,masks} from the 300 training images, split by
photograph: STEM-1, STEM-2, ... are crops of photograph STEM and stay on one side, as in the
dataset's own train/test split. Photographs drawn in the order random.Random(S) (default seed 1)
shuffles their sorted names validate until they hold at least N images (default 60); the rest
train. OUT/test/{images,masks} holds the 237 test images, held out for the final figures.
Masks (some 1-bit PNGs) are rewritten as 8-bit PNG (0, 255), binarised at > 127; images are
linked, not copied. Needs numpy and PIL (python3-pil).
"""
import argparse
import os
import random
import re
import struct
import sys
import zlib

import numpy as np


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
    import scipy.io

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


def deepcrack_pairs(src, part):
    """The sorted stems of SRC/PART_img/*.jpg, each with its SRC/PART_lab/STEM.png."""
    img_dir, lab_dir = os.path.join(src, part + "_img"), os.path.join(src, part + "_lab")
    imgs = {os.path.splitext(f)[0]: f for f in os.listdir(img_dir)
            if f.lower().endswith((".jpg", ".jpeg", ".png"))}
    labs = {os.path.splitext(f)[0] for f in os.listdir(lab_dir) if f.lower().endswith(".png")}
    if imgs.keys() != labs:
        sys.exit(f"crack_datasets: {src}: {part} images without masks "
                 f"{sorted(imgs.keys() - labs)[:5]}, "
                 f"masks without images {sorted(labs - imgs.keys())[:5]}")
    return [(s, os.path.join(img_dir, imgs[s]), os.path.join(lab_dir, s + ".png"))
            for s in sorted(imgs)]


def photograph(stem):
    """The photograph a DeepCrack image was cut from: its stem without a trailing -N."""
    return re.sub(r"-[0-9]+$", "", stem)


def deepcrack(src, out, val, seed):
    from PIL import Image

    train = deepcrack_pairs(src, "train")
    test = deepcrack_pairs(src, "test")
    if not 0 < val < len(train):
        sys.exit(f"crack_datasets: {src}: {len(train)} training images, "
                 f"--val must be 1-{len(train) - 1}")
    photos = sorted({photograph(s) for s, _, _ in train})
    random.Random(seed).shuffle(photos)
    val_stems = set()
    for photo in photos:
        if len(val_stems) >= val:
            break
        val_stems |= {s for s, _, _ in train if photograph(s) == photo}
    splits = {"train": [p for p in train if p[0] not in val_stems],
              "val": [p for p in train if p[0] in val_stems], "test": test}
    sizes, crack, pixels, non_binary = {}, 0, 0, 0
    for split, pairs in splits.items():
        stems = {s for s, _, _ in pairs}
        for sub in ("images", "masks"):
            d = os.path.join(out, split, sub)
            os.makedirs(d, exist_ok=True)
            for f in os.listdir(d):  # left over from a run with another --val or --seed
                if os.path.splitext(f)[0] not in stems:
                    os.remove(os.path.join(d, f))
        for stem, img, lab in pairs:
            with Image.open(img) as im:
                size = im.size
            with Image.open(lab) as m:
                a = np.asarray(m.convert("L"))
            if (a.shape[1], a.shape[0]) != size:
                sys.exit(f"crack_datasets: {lab} is {a.shape[1]}x{a.shape[0]}, "
                         f"its image {size[0]}x{size[1]}")
            non_binary += int(not np.isin(a, (0, 255)).all())
            mask = np.where(a > 127, 255, 0).astype(np.uint8)
            if split != "test":
                crack += int((mask > 0).sum())
                pixels += mask.size
            sizes[size] = sizes.get(size, 0) + 1
            write_png_gray(os.path.join(out, split, "masks", stem + ".png"), mask)
            link = os.path.join(out, split, "images", os.path.basename(img))
            if os.path.lexists(link):
                os.remove(link)
            os.symlink(os.path.abspath(img), link)
    size_text = ", ".join(f"{n} of {w}x{h}" for (w, h), n in sorted(sizes.items()))
    n_photos = len({photograph(s) for s in val_stems})
    print(f"deepcrack: {len(splits['train'])} train, {len(splits['val'])} val "
          f"({n_photos} photographs, seed {seed}), "
          f"{len(test)} test images ({size_text}); {100.0 * crack / pixels:.2f}% crack pixels in "
          f"train+val; {non_binary} masks not 0/255 (binarised at > 127) -> {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset", choices=["crackforest", "deepcrack"])
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--train", type=int, default=72, help="crackforest: training images")
    ap.add_argument("--val", type=int, default=60, help="deepcrack: validation images, at least (whole photographs)")
    ap.add_argument("--seed", type=int, default=1, help="deepcrack: seed of the validation draw")
    a = ap.parse_args()
    if a.dataset == "crackforest":
        crackforest(a.src, a.out, a.train)
    else:
        deepcrack(a.src, a.out, a.val, a.seed)


if __name__ == "__main__":
    main()
