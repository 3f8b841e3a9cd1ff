#!/usr/bin/env python3
"""Converts a PyTorch state_dict (.pt) of the reference network to a dptrain weights file.

  /usr/bin/python3 tools/pt_to_h5.py model.pt weights.h5
  mpirun -np 2 dptrain --init-weights weights.h5 ...      # continue training in dptrain

Every floating-point tensor is written under its state_dict key; dptrain maps the keys (and the
reference's duplicate `encoder.*` spellings) to its own names and checks every shape.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_h5 import write_weights  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("state_dict")
    ap.add_argument("output")
    args = ap.parse_args()
    sd = torch.load(args.state_dict, map_location="cpu")
    if not isinstance(sd, dict):
        sd = sd.state_dict()  # a whole pickled module
    sd = sd.get("model", sd)  # the reference's training script saves {"model": ..., ...}
    write_weights(args.output, sd, source=os.path.basename(args.state_dict))
    print(f"{args.output}: {sum(torch.is_floating_point(t) for t in sd.values())} tensors")


if __name__ == "__main__":
    main()
