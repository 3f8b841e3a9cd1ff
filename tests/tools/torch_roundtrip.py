#!/usr/bin/env python3
"""Weights both ways between PyTorch and dptrain, checked on logits (ctest 'torch_roundtrip').

PyTorch -> dptrain: a reference module with random weights and batch-norm statistics is saved as
.pt, converted by tools/pt_to_h5.py, loaded by dptrain (model_forward) and run on the same input.
dptrain -> PyTorch: the model as dptrain saved it (a checkpoint) goes through tools/h5_to_pt.py
and loads with load_state_dict(strict=True). Both must give the same logits (max abs diff 1e-4).
Exits 77 (skipped) where PyTorch or h5py is not installed.
"""
import os
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
    import torch
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
import models  # noqa: E402

TOL = 1e-4


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stdout}{r.stderr}")


def check(forward_tool, name, d, deconv, size, tmp):
    torch.manual_seed(7)
    m = models.make(name, width_divisor=d, is_deconv=deconv).eval()
    models.lively_init(m)
    x = torch.rand(2, 3, size, size) * 2 - 1
    # Batch-norm running statistics of real activations (one training-mode pass with momentum 1),
    # so that the evaluation-mode network stays normalised.
    bns = [mod for mod in m.modules() if isinstance(mod, torch.nn.BatchNorm2d)]
    for mod in bns:
        mod.momentum = 1.0
    with torch.no_grad():
        m.train()(torch.rand(2, 3, size, size) * 2 - 1)
    m.eval()
    with torch.no_grad():
        ref = m(x).permute(0, 2, 3, 1).numpy()
    if ref.std() < 1e-3:
        raise SystemExit(f"{name}: the reference logits are constant; the comparison would be empty")
    pt, weights = os.path.join(tmp, "m.pt"), os.path.join(tmp, "w.h5")
    inp, out, ckpt = (os.path.join(tmp, f) for f in ("in.h5", "out.h5", "ckpt.h5"))
    torch.save(m.state_dict(), pt)
    run([sys.executable, os.path.join(ROOT, "tools", "pt_to_h5.py"), pt, weights])
    with h5py.File(inp, "w") as f:
        f.create_dataset("input", data=x.permute(0, 2, 3, 1).numpy())
    run([forward_tool, name, str(d), str(int(deconv)), weights, inp, out, ckpt])
    with h5py.File(out) as f:
        got = np.asarray(f["logits"])
    scale = float(np.abs(ref).max())
    diff_in = float(np.abs(got - ref).max())

    back = os.path.join(tmp, "back.pt")
    run([sys.executable, os.path.join(ROOT, "tools", "h5_to_pt.py"), ckpt, back])
    m2 = models.make(name, width_divisor=d, is_deconv=deconv).eval()
    m2.load_state_dict(torch.load(back), strict=True)
    with torch.no_grad():
        again = m2(x).permute(0, 2, 3, 1).numpy()
    diff_out = float(np.abs(again - got).max())
    label = f"{name}{' --deconv' if deconv else ''} /{d}"
    print(f"{label:28s} torch->dptrain max abs diff {diff_in:.2e}, "
          f"dptrain->torch (strict load) {diff_out:.2e} (max |logit| {scale:.3f})")
    return diff_in <= TOL and diff_out <= TOL


def main():
    forward_tool = sys.argv[1]
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for name, d, deconv, size in [("unet16", 8, False, 64), ("unet16", 8, True, 64),
                                      ("unet_resnet34", 8, False, 64),
                                      ("unet_resnet101", 16, False, 64)]:
            ok &= check(forward_tool, name, d, deconv, size, tmp)
    print("1 passed, 0 failed" if ok else "0 passed, 1 failed")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
