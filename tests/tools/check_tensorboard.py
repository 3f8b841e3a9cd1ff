#!/usr/bin/env python3
"""Reads dptrain's TensorBoard events back with the `tensorboard` package (e2e/tensorboard).

Usage: check_tensorboard.py RUN_DIR REFERENCE_DIR --epochs E --steps-per-epoch N [--resumed-at S]

RUN_DIR/tb must hold what an uninterrupted run (REFERENCE_DIR, same options) holds: every record
framed with TensorBoard's masked CRC-32C; train/loss, train/lr and train/images_per_s at each
step 1..E*N exactly once, the losses equal to the reference's; the epoch and validation scalars
at steps N, 2N, ... equal to RUN_DIR/metrics.csv; each validation sample's image strip (image |
ground truth | prediction) at every epoch, equal to the reference's; the configuration text at
step 0 (and at S where the run resumed). Prints each mismatch and exits 1; exits 77 where the
tensorboard or Pillow package is missing.
"""
import argparse
import csv
import glob
import io
import math
import os
import struct
import sys

try:
    import numpy as np
    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
except ImportError as e:
    print(f"skipped: {e} (scripts/install-test-deps.sh installs tensorboard and Pillow)")
    sys.exit(77)

ALL = {"scalars": 0, "images": 0, "tensors": 0}
GAP = 4  # pixels between the panels of a sample strip

errors = []


def expect(cond, message):
    if not cond:
        errors.append(message)
    return cond


def check_records(tb_dir):
    """Every record of every event file: both CRCs as TensorBoard computes them."""
    files = sorted(glob.glob(os.path.join(tb_dir, "events.out.tfevents.*")))
    expect(len(files) == 1, f"{tb_dir}: {len(files)} event files, expected 1")
    for path in files:
        data = open(path, "rb").read()
        at = records = 0
        while at < len(data):
            (length,) = struct.unpack_from("<Q", data, at)
            (length_crc,) = struct.unpack_from("<I", data, at + 8)
            if not expect(length_crc == masked_crc32c(data[at : at + 8]),
                          f"{path}: bad length CRC at byte {at}"):
                return
            body = data[at + 12 : at + 12 + length]
            (body_crc,) = struct.unpack_from("<I", data, at + 12 + length)
            if not expect(body_crc == masked_crc32c(body), f"{path}: bad data CRC at byte {at}"):
                return
            at += 12 + length + 4
            records += 1
        expect(at == len(data), f"{path}: {len(data) - at} trailing bytes")
        print(f"{path}: {records} records, {len(data)} bytes, CRCs as TensorBoard's")


def load(run_dir):
    ea = EventAccumulator(os.path.join(run_dir, "tb"), size_guidance=ALL)
    ea.Reload()
    return ea


def steps(events):
    return [e.step for e in events]


def strip_panels(png, width, height):
    img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    expect(img.shape[:2] == (height, width), f"PNG is {img.shape[:2]}, event says {height}x{width}")
    panel = (img.shape[1] - 2 * GAP) // 3
    return [img[:, k * (panel + GAP) : k * (panel + GAP) + panel] for k in range(3)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("reference")
    ap.add_argument("--epochs", type=int, required=True)
    ap.add_argument("--steps-per-epoch", type=int, required=True)
    ap.add_argument("--resumed-at", type=int, default=None)
    a = ap.parse_args()
    total = a.epochs * a.steps_per_epoch
    epoch_steps = [a.steps_per_epoch * (e + 1) for e in range(a.epochs)]

    check_records(os.path.join(a.run, "tb"))
    run, ref = load(a.run), load(a.reference)

    # Per-step curves: one point per step, none repeated after the resume; the reference's values.
    for tag in ("train/loss", "train/lr", "train/images_per_s"):
        expect(steps(run.Scalars(tag)) == list(range(1, total + 1)),
               f"{tag}: steps {steps(run.Scalars(tag))}, expected 1..{total} once each")
    for r, f in zip(run.Scalars("train/loss"), ref.Scalars("train/loss")):
        expect(math.isclose(r.value, f.value, rel_tol=1e-5),
               f"train/loss at step {r.step}: {r.value}, uninterrupted run {f.value}")

    # Per-epoch scalars at the epochs' last steps, as metrics.csv has them.
    with open(os.path.join(a.run, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    expect(len(rows) == a.epochs, f"metrics.csv has {len(rows)} rows")
    columns = {"epoch/train_loss": "train_loss", "epoch/lr": "lr", "epoch/images_per_s": "img_per_s",
               "epoch/seconds": "seconds", "valid/loss": "valid_loss", "valid/iou": "iou",
               "valid/dice": "dice", "valid/precision": "precision", "valid/recall": "recall",
               "valid/ods": "ods", "valid/ods_threshold": "ods_threshold", "valid/ois": "ois",
               "valid/ap": "ap", "valid_at_ods/iou": "iou_at_ods", "valid_at_ods/dice": "dice_at_ods",
               "valid_at_ods/precision": "precision_at_ods", "valid_at_ods/recall": "recall_at_ods",
               "valid/cldice": "cldice"}
    for tag, column in columns.items():
        events = run.Scalars(tag)
        expect(steps(events) == epoch_steps, f"{tag}: steps {steps(events)}, expected {epoch_steps}")
        for e, row in zip(events, rows):
            expect(math.isclose(e.value, float(row[column]), rel_tol=1e-5, abs_tol=1e-6),
                   f"{tag} at step {e.step}: {e.value}, metrics.csv {column} {row[column]}")
    expect(steps(run.Scalars("epoch/allreduce_wait_ms")) == epoch_steps, "allreduce_wait_ms steps")

    # Sample strips: image | truth | prediction, the reference's at every validated epoch.
    tags = sorted(run.Tags()["images"])
    expect(len(tags) == 4 and tags == sorted(ref.Tags()["images"]), f"image tags {tags}")
    for tag in tags:
        got, want = run.Images(tag), ref.Images(tag)
        expect(steps(got) == epoch_steps, f"{tag}: steps {steps(got)}, expected {epoch_steps}")
        for g, w in zip(got, want):
            gp = strip_panels(g.encoded_image_string, g.width, g.height)
            wp = strip_panels(w.encoded_image_string, w.width, w.height)
            for name, p in zip(("truth", "prediction"), gp[1:]):
                expect(set(np.unique(p)) <= {0, 255}, f"{tag} step {g.step}: {name} not 0/255")
            expect(gp[0].std() > 0, f"{tag} step {g.step}: the image panel is flat")
            for name, p, q in zip(("image", "truth", "prediction"), gp, wp):
                expect(np.array_equal(p, q), f"{tag} step {g.step}: {name} differs from the "
                       "uninterrupted run's")

    # The configuration, once per start.
    config = run.Tensors("config")
    starts = [0] + ([a.resumed_at] if a.resumed_at is not None else [])
    expect(steps(config) == starts, f"config at steps {steps(config)}, expected {starts}")
    for e in config:
        expect(b"tensorboard = 1" in e.tensor_proto.string_val[0], "config text lacks the options")

    for m in errors:
        print("MISMATCH:", m)
    if not errors:
        print(f"ok: {total} steps, {a.epochs} epochs, {len(tags)} sample strips per epoch")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
