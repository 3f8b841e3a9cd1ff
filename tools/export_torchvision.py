#!/usr/bin/env python3
"""Writes ImageNet-pretrained torchvision encoder weights to a dptrain weights file.

  python3 tools/export_torchvision.py --arch vgg16 --out vgg16.h5      # for --model unet16
  python3 tools/export_torchvision.py --arch resnet34 --out resnet34.h5
  mpirun -np 2 dptrain --model unet_resnet34 --encoder-weights resnet34.h5 ...

Needs torchvision and its pretrained weights where you run it (they are downloaded to, or read
from, torchvision's cache; on a cluster without internet, copy the cache). --random writes
randomly initialised weights instead (no download), e.g. to try the pipeline.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_h5 import write_weights  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", required=True, choices=["vgg16", "resnet34", "resnet101"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--random", action="store_true", help="random init, no pretrained download")
    args = ap.parse_args()
    import torchvision  # noqa: E402 (only this tool needs it)
    ctor = getattr(torchvision.models, args.arch)
    try:
        model = ctor(weights=None if args.random else "DEFAULT")
    except TypeError:  # torchvision < 0.13
        model = ctor(pretrained=not args.random)
    sd = model.state_dict()
    if args.arch == "vgg16":
        sd = {k: v for k, v in sd.items() if k.startswith("features.")}
    write_weights(args.out, sd, arch=args.arch, pretrained=int(not args.random))
    print(f"{args.out}: {args.arch}, {len(sd)} tensors")


if __name__ == "__main__":
    main()
