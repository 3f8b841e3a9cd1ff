#!/usr/bin/env python3
"""Writes dptrain's golden test files (tests/golden/*.h5) from the PyTorch reference.

Run with Debian's PyTorch: /usr/bin/python3 tools/reference/make_goldens.py [--out tests/golden]
Format "dp-golden-v1": activations stored NHWC (dptrain's layout), weights in PyTorch's layout
(OIHW; IOHW for transposed convolutions). References are computed in float64 from float32 inputs
and stored as float32. The C++ tests (tests/unit/test_golden.cpp) need no Python.
"""
import argparse
import os

import h5py
import numpy as np
import torch
from torch.nn import functional as F

import models

FORMAT = "dp-golden-v1"


def nhwc(t):
    """NCHW tensor -> NHWC float32 array (2-D and 1-D tensors are stored as they are)."""
    a = t.detach().to(torch.float64)
    if a.dim() == 4:
        a = a.permute(0, 2, 3, 1)
    return a.contiguous().numpy().astype(np.float32)


def plain(t):
    return t.detach().to(torch.float64).contiguous().numpy().astype(np.float32)


def rand(*shape, lo=-1.0, hi=1.0):
    """float32-representable values, returned as float64 leaf tensors requiring grad."""
    t = (torch.rand(*shape, dtype=torch.float32) * (hi - lo) + lo).to(torch.float64)
    return t.requires_grad_()


COMPACT_LIMIT = 60000  # bytes: HDF5 stores smaller datasets in their object header (less overhead)


def put(loc, name, array):
    """Creates dataset `name` (parents included) holding `array`; compact layout when small."""
    array = np.ascontiguousarray(array)
    if array.nbytes > COMPACT_LIMIT:
        loc.create_dataset(name, data=array)
        return
    parent, _, leaf = name.rpartition("/")
    group = loc.require_group(parent) if parent else loc
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_layout(h5py.h5d.COMPACT)
    space = h5py.h5s.create_simple(array.shape)
    tid = h5py.h5t.py_create(array.dtype)
    dset = h5py.h5d.create(group.id, leaf.encode(), tid, space, dcpl=dcpl)
    dset.write(h5py.h5s.ALL, h5py.h5s.ALL, array)


def write_case(f, name, attrs, **arrays):
    g = f.create_group(name)
    for k, v in attrs.items():
        g.attrs[k] = v
    for k, v in arrays.items():
        put(g, k, v)


def layer_goldens(path):
    torch.manual_seed(1234)
    with h5py.File(path, "w", libver="latest") as f:
        f.attrs["format"] = FORMAT
        f.attrs["torch_version"] = str(torch.__version__)
        # Convolutions: (name, n, cin, cout, h, w, kernel, stride, pad, bias)
        for name, n, cin, cout, h, w, k, s, p, bias in [
            ("conv3x3", 2, 3, 4, 6, 5, 3, 1, 1, True),
            ("conv1x1", 3, 6, 1, 4, 4, 1, 1, 0, True),
            ("conv3x3_wide", 2, 32, 16, 8, 8, 3, 1, 1, True),
            ("conv7x7_s2", 2, 3, 8, 16, 16, 7, 2, 3, False),
            ("conv3x3_s2", 2, 8, 16, 8, 8, 3, 2, 1, False),
            ("conv1x1_s2", 2, 8, 16, 8, 8, 1, 2, 0, False),
        ]:
            x, wt = rand(n, cin, h, w), rand(cout, cin, k, k, lo=-0.5, hi=0.5)
            b = rand(cout, lo=-0.2, hi=0.2) if bias else None
            y = F.conv2d(x, wt, b, stride=s, padding=p)
            dy = rand(*y.shape).detach()
            grads = torch.autograd.grad(y, [x, wt] + ([b] if bias else []), dy)
            arrays = dict(x=nhwc(x), w=plain(wt), y=nhwc(y), dy=nhwc(dy), dx=nhwc(grads[0]),
                          dw=plain(grads[1]))
            if bias:
                arrays.update(b=plain(b), db=plain(grads[2]))
            write_case(f, name, dict(kernel=k, stride=s, pad=p, bias=int(bias)), **arrays)

        x = rand(2, 5, 6, 4)
        y = F.relu(x)
        dy = rand(*y.shape).detach()
        (dx,) = torch.autograd.grad(y, [x], dy)
        write_case(f, "relu", {}, x=nhwc(x), y=nhwc(y), dy=nhwc(dy), dx=nhwc(dx))

        x = rand(2, 5, 6, 4)
        y = F.max_pool2d(x, 2, 2)
        dy = rand(*y.shape).detach()
        (dx,) = torch.autograd.grad(y, [x], dy)
        write_case(f, "maxpool2x2", {}, x=nhwc(x), y=nhwc(y), dy=nhwc(dy), dx=nhwc(dx))

        x = rand(2, 4, 3, 5)
        y = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
        dy = rand(*y.shape).detach()
        (dx,) = torch.autograd.grad(y, [x], dy)
        write_case(f, "upsample2x", {}, x=nhwc(x), y=nhwc(y), dy=nhwc(dy), dx=nhwc(dx))

        a, b = rand(2, 4, 3, 3), rand(2, 6, 3, 3)
        y = torch.cat([a, b], 1)
        dy = rand(*y.shape).detach()
        da, db = torch.autograd.grad(y, [a, b], dy)
        write_case(f, "concat", {}, a=nhwc(a), b=nhwc(b), y=nhwc(y), dy=nhwc(dy), da=nhwc(da),
                   db=nhwc(db))

        # Transposed convolution as in DecoderBlockV2(is_deconv=True): k=4, s=2, p=1.
        x, wt, b = rand(2, 6, 3, 4), rand(6, 5, 4, 4, lo=-0.5, hi=0.5), rand(5, lo=-0.2, hi=0.2)
        y = F.conv_transpose2d(x, wt, b, stride=2, padding=1)
        dy = rand(*y.shape).detach()
        dx, dw, dbias = torch.autograd.grad(y, [x, wt, b], dy)
        write_case(f, "deconv4x4_s2", dict(kernel=4, stride=2, pad=1), x=nhwc(x), w=plain(wt),
                   b=plain(b), y=nhwc(y), dy=nhwc(dy), dx=nhwc(dx), dw=plain(dw), db=plain(dbias))

        # Batch norm (eps 1e-5, momentum 0.1), training (batch statistics, running stats updated
        # with the unbiased variance) and evaluation (running statistics).
        for training in (True, False):
            x = rand(3, 5, 4, 6, lo=-2.0, hi=3.0)
            gamma, beta = rand(5, lo=0.5, hi=1.5), rand(5, lo=-0.5, hi=0.5)
            rm = torch.rand(5, dtype=torch.float32).to(torch.float64)
            rv = (torch.rand(5, dtype=torch.float32) + 0.5).to(torch.float64)
            rm0, rv0 = rm.clone(), rv.clone()
            y = F.batch_norm(x, rm, rv, gamma, beta, training=training, momentum=0.1, eps=1e-5)
            dy = rand(*y.shape).detach()
            dx, dg, dbeta = torch.autograd.grad(y, [x, gamma, beta], dy)
            write_case(f, "batchnorm_train" if training else "batchnorm_eval",
                       dict(eps=1e-5, momentum=0.1, training=int(training)),
                       x=nhwc(x), gamma=plain(gamma), beta=plain(beta), running_mean=plain(rm0),
                       running_var=plain(rv0), running_mean_after=plain(rm),
                       running_var_after=plain(rv), y=nhwc(y), dy=nhwc(dy), dx=nhwc(dx),
                       dgamma=plain(dg), dbeta=plain(dbeta))

        for name, pw in (("bce", 1.0), ("bce_pos_weight", 3.7)):
            x = rand(2, 1, 6, 5, lo=-6.0, hi=6.0)
            t = (torch.rand(2, 1, 6, 5) < 0.3).to(torch.float64)
            loss = F.binary_cross_entropy_with_logits(
                x, t, pos_weight=torch.tensor([pw], dtype=torch.float64), reduction="mean")
            (dx,) = torch.autograd.grad(loss, [x])
            write_case(f, name, dict(pos_weight=pw, loss=float(loss)), x=nhwc(x), target=nhwc(t),
                       dx=nhwc(dx))


def dice_loss(x, t, smooth):
    """Soft Dice per image, averaged over the images (dptrain --loss dice)."""
    p = torch.sigmoid(x)
    inter = (p * t).sum(dim=(1, 2, 3))
    card = p.sum(dim=(1, 2, 3)) + t.sum(dim=(1, 2, 3))
    return (1 - (2 * inter + smooth) / (card + smooth)).mean()


def focal_loss(x, t, alpha, gamma):
    """torchvision.ops.sigmoid_focal_loss(reduction="mean"), written out (dptrain --loss focal)."""
    p = torch.sigmoid(x)
    ce = F.binary_cross_entropy_with_logits(x, t, reduction="none")
    p_t = p * t + (1 - p) * (1 - t)
    loss = ce * (1 - p_t) ** gamma
    if alpha >= 0:
        loss = (alpha * t + (1 - alpha) * (1 - t)) * loss
    return loss.mean()


def soft_erode(img):
    """The published soft erosion (Shit et al., clDice repository): min of 3x1 and 1x3 min-pools."""
    p1 = -F.max_pool2d(-img, (3, 1), (1, 1), (1, 0))
    p2 = -F.max_pool2d(-img, (1, 3), (1, 1), (0, 1))
    return torch.min(p1, p2)


def soft_dilate(img):
    return F.max_pool2d(img, (3, 3), (1, 1), (1, 1))


def soft_skel(img, iterations):
    """The published soft_skel: the opening's residues of `iterations` successive erosions."""
    skel = F.relu(img - soft_dilate(soft_erode(img)))
    for _ in range(iterations):
        img = soft_erode(img)
        delta = F.relu(img - soft_dilate(soft_erode(img)))
        skel = skel + F.relu(delta - skel * delta)
    return skel


def soft_cldice_loss(x, t, iterations, smooth):
    """Soft clDice per image (the published soft_cldice with per-image sums), averaged."""
    p = torch.sigmoid(x)
    sp, st = soft_skel(p, iterations), soft_skel(t, iterations)
    tprec = ((sp * t).sum(dim=(1, 2, 3)) + smooth) / (sp.sum(dim=(1, 2, 3)) + smooth)
    tsens = ((st * p).sum(dim=(1, 2, 3)) + smooth) / (st.sum(dim=(1, 2, 3)) + smooth)
    return (1 - 2 * tprec * tsens / (tprec + tsens)).mean()


def crack_masks(n, h, w):
    """n masks (N, 1, H, W) float64 of one to three random bands 1-4 px wide; the last empty."""
    y, x = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64),
                          indexing="ij")
    t = torch.zeros(n, 1, h, w, dtype=torch.float64)
    for i in range(n - 1):
        for _ in range(int(torch.randint(1, 4, ()))):
            a = float(torch.rand(()) * 3.1416)
            c = torch.rand(2, dtype=torch.float64) * torch.tensor([h, w], dtype=torch.float64)
            d = ((y - c[0]) * torch.cos(torch.tensor(a)) - (x - c[1]) * torch.sin(torch.tensor(a))).abs()
            t[i, 0] = torch.maximum(t[i, 0], (d < 0.5 + float(torch.rand(()) * 1.5)).to(torch.float64))
    return t


def cldice_loss_goldens(f):
    """--loss with cldice: soft clDice's value and gradient, alone (continuous logits, and logits
    on a coarse grid so that windows hold equal values: max-pooling's first index and
    torch.minimum's halves decide the gradient) and as bce+dice+cldice."""
    n, h, w = 4, 24, 20
    t = crack_masks(n, h, w)
    x = rand(n, 1, h, w, lo=-4.0, hi=4.0)
    xq = (torch.randint(-4, 5, (n, 1, h, w)).to(torch.float64) / 2).requires_grad_()
    pw = torch.tensor([3.0], dtype=torch.float64)
    cases = [("cldice", x, dict(iterations=3, smooth=1.0, weight=1.0),
              lambda: soft_cldice_loss(x, t, 3, 1.0)),
             ("cldice_ties", xq, dict(iterations=3, smooth=1.0, weight=1.0),
              lambda: soft_cldice_loss(xq, t, 3, 1.0)),
             ("bce_dice_cldice", x, dict(iterations=2, smooth=1.0, weight=0.5, pos_weight=3.0),
              lambda: F.binary_cross_entropy_with_logits(x, t, pos_weight=pw) + dice_loss(x, t, 1.0)
              + 0.5 * soft_cldice_loss(x, t, 2, 1.0))]
    for name, xs, attrs, fn in cases:
        loss = fn()
        (dx,) = torch.autograd.grad(loss, [xs])
        write_case(f, name, dict(attrs, loss=float(loss), images=n, height=h, width=w), x=nhwc(xs),
                   target=nhwc(t), dx=nhwc(dx))


def loss_goldens(path):
    """--loss bce+dice, dice and focal: value and gradient on 3 images (one without cracks)."""
    torch.manual_seed(2468)
    with h5py.File(path, "w", libver="latest") as f:
        f.attrs["format"] = FORMAT
        x = rand(3, 1, 8, 6, lo=-5.0, hi=5.0)
        t = (torch.rand(3, 1, 8, 6) < 0.25).to(torch.float64)
        t[2] = 0  # an image without cracks
        cases = [("dice", dict(smooth=1.0), lambda: dice_loss(x, t, 1.0)),
                 ("dice_smooth0", dict(smooth=0.0), lambda: dice_loss(x[:2], t[:2], 0.0)),
                 ("bce_dice", dict(pos_weight=2.5, smooth=1.0), lambda: F.binary_cross_entropy_with_logits(
                     x, t, pos_weight=torch.tensor([2.5], dtype=torch.float64)) + dice_loss(x, t, 1.0)),
                 ("focal", dict(alpha=0.25, gamma=2.0), lambda: focal_loss(x, t, 0.25, 2.0)),
                 ("focal_noalpha", dict(alpha=-1.0, gamma=1.5), lambda: focal_loss(x, t, -1.0, 1.5))]
        for name, attrs, fn in cases:
            loss = fn()
            (dx,) = torch.autograd.grad(loss, [x])
            images = 2 if name == "dice_smooth0" else 3
            write_case(f, name, dict(attrs, loss=float(loss), images=images), x=nhwc(x[:images]),
                       target=nhwc(t[:images]), dx=nhwc(dx[:images]))
        cldice_loss_goldens(f)


def canonical_tensors(model, kind):
    """state_dict entries of `kind` ('param' or 'buffer'), one name per tensor: the reference lists
    shared encoder layers twice (encoder.* and conv*.*); dptrain's name is the non-encoder one."""
    tensors = {k: v for k, v in model.state_dict(keep_vars=True).items()
               if isinstance(v, torch.nn.Parameter) == (kind == "param")}
    by_id = {}
    for name, t in tensors.items():
        by_id.setdefault(id(t), []).append(name)
    out = {}
    for names in by_id.values():
        chosen = sorted(names, key=lambda s: (s.startswith("encoder."), s))[0]
        if chosen.startswith("encoder.fc.") or chosen.endswith("num_batches_tracked"):
            continue  # the classifier is not part of the segmentation network
        out[chosen] = tensors[chosen]
    return out


def model_golden(path, name, n, size, deconv=False, d=32, lr=0.01, momentum=0.9, wd=1e-4,
                 split_step=False, bf16=False):
    """One training step of `name` at width 1/d: input, target, logits, loss, every gradient,
    batch-norm buffers before/after, and the parameters after one SGD step (in a second file,
    <name>_step.h5, with split_step: ResNet101's three parameter sets would pass 1 MB).
    bf16: the model in float32 under torch.autocast("cpu", bfloat16) (dptrain's --precision bf16),
    the loss in float32 as autocast computes it; else everything in float64."""
    torch.manual_seed(4321)
    dtype = torch.float32 if bf16 else torch.float64
    model = models.make(name, width_divisor=d, is_deconv=deconv).to(dtype)
    if hasattr(model, "dropout_2d"):
        model.dropout_2d = 0.0  # random masks cannot be compared; dropout is tested on its own
    # At width 1/32 some layers have one or two channels: keep every layer alive.
    models.lively_init(model)
    params = canonical_tensors(model, "param")
    buffers = canonical_tensors(model, "buffer")
    before = {k: plain(v) for k, v in params.items()}
    buffers_before = {k: plain(v) for k, v in buffers.items()}
    x = (torch.rand(n, 3, size, size, dtype=torch.float32) * 4 - 2).to(dtype)
    t = (torch.rand(n, 1, size, size) < 0.2).to(dtype)
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(x)
        if bf16 and logits.dtype != torch.bfloat16:
            raise SystemExit(f"{name}: autocast produced {logits.dtype} logits, expected bfloat16")
        loss = F.binary_cross_entropy_with_logits(logits, t)
    model.zero_grad()
    loss.backward()
    grads = {k: plain(v.grad) for k, v in params.items()}
    dead = [k for k, v in grads.items() if not np.any(v)]
    if dead:
        raise SystemExit(f"{name}: all-zero gradients in {len(dead)} tensors, e.g. {dead[:3]}")
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=wd)
    opt.step()
    with h5py.File(path, "w", libver="latest") as f:
        f.attrs.update(dict(format=FORMAT, torch_version=str(torch.__version__), model=name,
                            deconv=int(deconv), width_divisor=d, loss=float(loss), lr=lr,
                            precision="bf16" if bf16 else "fp32",
                            momentum=momentum, weight_decay=wd, has_step=int(not split_step)))
        step_path = path.replace(".h5", "_step.h5")
        if split_step:
            f.attrs["step_file"] = os.path.basename(step_path)
        put(f, "input", nhwc(x))
        put(f, "target", nhwc(t))
        put(f, "logits", nhwc(logits))
        # Tensors of a kind are concatenated in name order into one flat dataset (one dataset per
        # tensor costs ~350 bytes of HDF5 metadata each, which ResNet101's 1100 tensors notice);
        # `<kind>_names` (newline-separated) and `<kind>_sizes` say where each one is.
        def pack(kind, arrays):
            names = sorted(arrays)
            f.attrs[f"{kind}_names"] = "\n".join(names)
            put(f, f"{kind}_sizes", np.array([arrays[k].size for k in names], dtype=np.float32))
            return lambda ds, values: put(f, ds, np.concatenate(
                [values[k].reshape(-1) for k in names]) if names else np.zeros(0, np.float32))

        put_params = pack("param", before)
        put_params("params", before)
        put_params("grads", grads)
        after = {k: plain(v) for k, v in params.items()}
        if not split_step:
            put_params("params_after", after)
        put_buffers = pack("buffer", buffers_before)
        put_buffers("buffers", buffers_before)
        put_buffers("buffers_after", {k: plain(v) for k, v in buffers.items()})
    if split_step:
        with h5py.File(step_path, "w", libver="latest") as g:
            g.attrs.update(dict(format=FORMAT, model=name, param_names="\n".join(sorted(after))))
            put(g, "params_after", np.concatenate([after[k].reshape(-1) for k in sorted(after)]))
    return os.path.getsize(path)


def ema_golden(path, name="unet_resnet34", n=1, size=64, d=32, steps=3, decay=0.8, lr=0.01,
               momentum=0.9, wd=1e-4):
    """dptrain --ema: `steps` SGD steps of `name` at width 1/d in train mode (batch-norm running
    statistics move), each on its own random batch, with the weights' moving average after every
    step as timm's ModelEmaV2 computes it (ema = decay * ema + (1 - decay) * w over the
    parameters and the batch-norm buffers, starting from the initial weights). float64."""
    torch.manual_seed(2468)
    model = models.make(name, width_divisor=d).to(torch.float64)
    if hasattr(model, "dropout_2d"):
        model.dropout_2d = 0.0
    models.lively_init(model)
    params = canonical_tensors(model, "param")
    buffers = canonical_tensors(model, "buffer")
    before = {k: plain(v) for k, v in params.items()}
    buffers_before = {k: plain(v) for k, v in buffers.items()}
    ema = {k: v.detach().clone() for k, v in {**params, **buffers}.items()}  # ModelEmaV2(model)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=wd)
    model.train()
    batches = []
    for _ in range(steps):
        x = (torch.rand(n, 3, size, size, dtype=torch.float32) * 4 - 2).to(torch.float64)
        t = (torch.rand(n, 1, size, size) < 0.2).to(torch.float64)
        batches.append((x, t))
        loss = F.binary_cross_entropy_with_logits(model(x), t)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():  # ModelEmaV2.update
            for k, v in {**params, **buffers}.items():
                ema[k].copy_(ema[k] * decay + (1.0 - decay) * v)
    with h5py.File(path, "w", libver="latest") as f:
        f.attrs.update(dict(format=FORMAT, torch_version=str(torch.__version__), model=name,
                            deconv=0, width_divisor=d, steps=steps, decay=decay, lr=lr,
                            momentum=momentum, weight_decay=wd))
        for k, (x, t) in enumerate(batches):
            put(f, f"input{k}", nhwc(x))
            put(f, f"target{k}", nhwc(t))

        def pack(kind, names):
            f.attrs[f"{kind}_names"] = "\n".join(names)
            put(f, f"{kind}_sizes", np.array([before.get(k, buffers_before.get(k)).size
                                              for k in names], dtype=np.float32))
            return lambda ds, values: put(f, ds, np.concatenate(
                [values[k].reshape(-1) for k in names]) if names else np.zeros(0, np.float32))

        put_params = pack("param", sorted(params))
        put_params("params", before)
        put_params("params_after", {k: plain(v) for k, v in params.items()})
        put_params("ema_params", {k: plain(ema[k]) for k in params})
        put_buffers = pack("buffer", sorted(buffers))
        put_buffers("buffers", buffers_before)
        put_buffers("ema_buffers", {k: plain(ema[k]) for k in buffers})
    return os.path.getsize(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "..", "tests", "golden"))
    ap.add_argument("--only", choices=["losses", "ema"],
                    help="write only this file (losses.h5, ema_unet_resnet34_w32.h5)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    if args.only != "losses":
        size_bytes = ema_golden(os.path.join(args.out, "ema_unet_resnet34_w32.h5"))
        print(f"ema_unet_resnet34_w32.h5: {size_bytes / 1024:.0f} KiB")
    if args.only == "ema":
        return
    loss_goldens(os.path.join(args.out, "losses.h5"))
    print(f"losses.h5: {os.path.getsize(os.path.join(args.out, 'losses.h5')) / 1024:.0f} KiB")
    if args.only:
        return
    layer_goldens(os.path.join(args.out, "layers.h5"))
    for name, n, size, deconv, split, bf16 in [("unet16", 2, 32, False, False, False),
                                               ("unet16", 2, 32, True, False, False),
                                               ("unet_resnet34", 2, 64, False, False, False),
                                               ("unet_resnet101", 2, 64, False, True, False),
                                               ("unet16", 2, 32, False, False, True),
                                               ("unet16", 2, 32, True, False, True)]:
        file = f"{name}{'_deconv' if deconv else ''}_w32{'_bf16' if bf16 else ''}.h5"
        size_bytes = model_golden(os.path.join(args.out, file), name, n, size, deconv,
                                  split_step=split, bf16=bf16)
        print(f"{file}: {size_bytes / 1024:.0f} KiB")
    print(f"layers.h5: {os.path.getsize(os.path.join(args.out, 'layers.h5')) / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
