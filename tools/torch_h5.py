"""HDF5 <-> PyTorch state_dict helpers shared by dptrain's conversion tools (h5py + torch).

Weights files ("dp-torch-weights-v1") hold one float32 dataset per state_dict key at the root;
dptrain reads them with --encoder-weights / --init-weights. dptrain checkpoints ("dp-checkpoint-v1")
hold /params/<name> and /buffers/<name> with dptrain's names (the reference network's keys without
its duplicate `encoder.*` aliases).
"""
import re

import h5py
import numpy as np
import torch

WEIGHTS_FORMAT = "dp-torch-weights-v1"
CHECKPOINT_FORMAT = "dp-checkpoint-v1"
VGG_INDEX = {0: (1, 0), 2: (1, 2), 5: (2, 0), 7: (2, 2), 10: (3, 0), 12: (3, 2), 14: (3, 4),
             17: (4, 0), 19: (4, 2), 21: (4, 4), 24: (5, 0), 26: (5, 2), 28: (5, 4)}


def canonical_name(model, key):
    """dptrain's name for a state_dict key (mirror of dp::canonical_weight_name), or None."""
    if "num_batches_tracked" in key:
        return None
    if model == "unet16":
        m = re.fullmatch(r"(?:features|encoder)\.(\d+)\.(weight|bias)", key)
        if m:
            stage = VGG_INDEX.get(int(m.group(1)))
            return None if stage is None else f"conv{stage[0]}.{stage[1]}.{m.group(2)}"
        return None if key.startswith("classifier.") else key
    k = key[len("encoder."):] if key.startswith("encoder.") else key
    if k.startswith("fc."):
        return None
    if k.startswith("conv1.") and not k.startswith(("conv1.0.", "conv1.1.")):
        return "conv1.0." + k[len("conv1."):]
    if k.startswith("bn1."):
        return "conv1.1." + k[len("bn1."):]
    m = re.fullmatch(r"layer([1-4])\.(.*)", k)
    return f"conv{int(m.group(1)) + 1}.{m.group(2)}" if m else k


def write_weights(path, state_dict, **attrs):
    """Writes the floating-point tensors of a state_dict as a dptrain weights file."""
    with h5py.File(path, "w") as f:
        f.attrs["format"] = WEIGHTS_FORMAT
        for k, v in attrs.items():
            f.attrs[k] = v
        for key, t in state_dict.items():
            if torch.is_floating_point(t):
                f.create_dataset(key, data=t.detach().cpu().to(torch.float32).numpy())


def read_checkpoint(path):
    """(tensors by dptrain name, root attributes) of a dptrain checkpoint."""
    with h5py.File(path, "r") as f:
        fmt = f.attrs.get("format", b"")
        fmt = fmt.decode() if isinstance(fmt, bytes) else str(fmt)
        if fmt != CHECKPOINT_FORMAT:
            raise SystemExit(f"{path}: format '{fmt}', expected '{CHECKPOINT_FORMAT}'")
        tensors = {}
        for group in ("params", "buffers"):
            if group in f:
                for name, d in f[group].items():
                    tensors[name] = torch.from_numpy(np.asarray(d, dtype=np.float32))
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
    return tensors, attrs


def to_state_dict(model, model_name, tensors, step=0):
    """The reference module's full state_dict filled from dptrain tensors: every alias of a
    shared layer gets the same values, num_batches_tracked the step count, and keys dptrain does
    not train (encoder.fc, VGG classifier) keep the module's own values."""
    sd = model.state_dict()
    out, used = {}, set()
    for key, ref in sd.items():
        name = canonical_name(model_name, key)
        if key.endswith("num_batches_tracked"):
            out[key] = torch.tensor(step, dtype=ref.dtype)
        elif name is None:
            out[key] = ref
        elif name in tensors:
            t = tensors[name]
            if tuple(t.shape) != tuple(ref.shape):
                raise SystemExit(f"{key}: dptrain's {name} is {tuple(t.shape)}, the reference "
                                 f"module's is {tuple(ref.shape)}")
            out[key] = t.to(ref.dtype)
            used.add(name)
        else:
            raise SystemExit(f"the checkpoint lacks {name} (reference key {key})")
    unused = sorted(set(tensors) - used)
    if unused:
        raise SystemExit(f"the checkpoint has tensors the reference module lacks: {unused[:5]}")
    return out
