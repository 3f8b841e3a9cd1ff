#!/usr/bin/env python3
"""Checks a dpexport model with the onnx package and ONNX Runtime against dppredict (e2e/export_onnx).

Usage: check_onnx_export.py MODEL.onnx --case N:H:W:INPUT:LOGITS [--case ...] [--prob]
                               [--meta KEY=VALUE ...] [--tolerance 1e-4]

INPUT holds the float32 values the model takes, NHWC [N, H, W, 3] (what dppredict's network
sees, laid out as dptrain stores images); LOGITS the float32 logits dppredict's network computed
from them, [N, H, W, 1]. For each case: shape inference on the model with the input's sizes
fixed must give `logits` (and `prob`) [N, 1, H, W]; ONNX Runtime's logits must equal the
reference within TOLERANCE relative (max |ort - ref| / max |ref|); `prob` must be their sigmoid.
Prints one line per case; exits 1 on the first failed check.
"""
import argparse
import copy
import sys
import time

import numpy as np
import onnx
import onnx.checker
import onnx.shape_inference
import onnxruntime as ort


def fail(msg):
    print(f"check_onnx_export: FAIL: {msg}", flush=True)
    sys.exit(1)


def dims_of(value_info):
    return [d.dim_value if d.HasField("dim_value") else d.dim_param
            for d in value_info.type.tensor_type.shape.dim]


def inferred_output_shapes(model, n, h, w):
    """Shape inference with the input's batch, height and width fixed."""
    m = copy.deepcopy(model)
    dims = m.graph.input[0].type.tensor_type.shape.dim
    for d, v in zip(dims, (n, 3, h, w)):
        d.Clear()
        d.dim_value = v
    for o in m.graph.output:  # what inference finds, not what the exporter declared
        o.type.tensor_type.ClearField("shape")
    inferred = onnx.shape_inference.infer_shapes(m, check_type=True, strict_mode=True,
                                                 data_prop=True)
    return {o.name: dims_of(o) for o in inferred.graph.output}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--case", action="append", required=True)
    p.add_argument("--prob", action="store_true")
    p.add_argument("--meta", action="append", default=[])
    p.add_argument("--tolerance", type=float, default=1e-4)
    a = p.parse_args()

    t0 = time.time()
    model = onnx.load(a.model)
    onnx.checker.check_model(model, full_check=True)
    opsets = {o.domain: o.version for o in model.opset_import}
    if opsets.get("", opsets.get("ai.onnx")) != 17:
        fail(f"opset {opsets}, expected 17")
    inputs = [i.name for i in model.graph.input]
    outputs = [o.name for o in model.graph.output]
    want_outputs = ["logits", "prob"] if a.prob else ["logits"]
    if inputs != ["image"] or outputs != want_outputs:
        fail(f"inputs {inputs}, outputs {outputs}; expected ['image'], {want_outputs}")
    if dims_of(model.graph.input[0]) != ["batch", 3, "height", "width"]:
        fail(f"input dims {dims_of(model.graph.input[0])}, expected [batch, 3, height, width]")
    meta = {e.key: e.value for e in model.metadata_props}
    for kv in a.meta:
        key, value = kv.split("=", 1)
        if meta.get(key) != value:
            fail(f"metadata {key} = {meta.get(key)!r}, expected {value!r} (all: {meta})")

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(a.model, options, providers=["CPUExecutionProvider"])
    for case in a.case:
        n, h, w, input_path, logits_path = case.split(":", 4)
        n, h, w = int(n), int(h), int(w)
        shapes = inferred_output_shapes(model, n, h, w)
        for name in want_outputs:
            if shapes.get(name) != [n, 1, h, w]:
                fail(f"{n}x3x{h}x{w}: shape inference gives {name} {shapes.get(name)}, "
                     f"expected {[n, 1, h, w]}")
        x = np.fromfile(input_path, dtype=np.float32).reshape(n, h, w, 3)
        ref = np.fromfile(logits_path, dtype=np.float32).reshape(n, h, w, 1)
        got = session.run(None, {"image": np.ascontiguousarray(x.transpose(0, 3, 1, 2))})
        logits = got[0]
        if list(logits.shape) != [n, 1, h, w]:
            fail(f"ONNX Runtime's logits are {list(logits.shape)}, expected {[n, 1, h, w]}")
        ref = ref.transpose(0, 3, 1, 2)
        diff = float(np.abs(logits.astype(np.float64) - ref).max())
        scale = float(np.abs(ref).max())
        rel = diff / max(scale, 1e-30)
        line = (f"{n}x3x{h}x{w}: max |ort - dppredict| = {diff:.3g}, max |logit| = {scale:.3g}, "
                f"relative {rel:.3g}")
        if a.prob:
            prob_diff = float(np.abs(got[1] - 1 / (1 + np.exp(-logits.astype(np.float64)))).max())
            line += f", max |prob - sigmoid(logits)| = {prob_diff:.3g}"
            if prob_diff > 1e-6:
                fail(line)
        print(f"check_onnx_export: {line}", flush=True)
        if not rel <= a.tolerance:
            fail(f"{line} > {a.tolerance}")
    print(f"check_onnx_export: ok ({len(model.graph.node)} nodes, onnx {onnx.__version__}, "
          f"onnxruntime {ort.__version__}, {time.time() - t0:.2f} s)", flush=True)


if __name__ == "__main__":
    main()
