#!/usr/bin/env python3
"""Converts a dptrain checkpoint to a PyTorch state_dict (.pt) for the reference network.

  /usr/bin/python3 tools/h5_to_pt.py runs/x/model_best.h5 model.pt [--deconv]

The result loads with `load_state_dict(strict=True)` into tools/reference/models.py's module (the
same keys as the reference crack-segmentation network, `encoder.*` aliases included).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference"))
import models  # noqa: E402
from torch_h5 import read_checkpoint, to_state_dict  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("output")
    ap.add_argument("--deconv", action="store_true",
                    help="the model used --deconv (default: the checkpoint's 'deconv' attribute)")
    args = ap.parse_args()
    tensors, attrs = read_checkpoint(args.checkpoint)
    name, d = attrs["model"], int(attrs["width_divisor"])
    deconv = args.deconv or bool(int(attrs.get("deconv", 0)))
    model = models.make(name, width_divisor=d, is_deconv=deconv)
    sd = to_state_dict(model, name, tensors, step=int(attrs.get("step", 0)))
    model.load_state_dict(sd, strict=True)
    torch.save(model.state_dict(), args.output)
    print(f"{args.output}: {name} (width 1/{d}{', deconv' if deconv else ''}), "
          f"{len(sd)} state_dict entries")


if __name__ == "__main__":
    main()
