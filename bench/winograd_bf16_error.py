#!/usr/bin/env python3
"""How far bf16 Winograd tiles land from the exact convolution: why bf16 training stays at F(2x2, 3x3).

    build/venv/bin/python3 bench/winograd_bf16_error.py [--channels 256] [--size 8] [--seed 0]

A 3x3, padding-1 convolution of post-ReLU inputs (half-normal, rounded to bf16, as dptrain stores
bf16 activations) with He-initialised fp32 filters, computed exactly in float64 (the reference)
and as dptrain's bf16 passes do: direct (oneDNN: filters rounded to bf16, exact products, fp32
sums) and Winograd F(m x n, 3x3) with the transformed tiles B^T d B and filters G g G^T rounded to
bf16 (the operands gemm_bf16 multiplies), the points' products summed exactly and A^T m A in
float64. The matrices come from Toom-Cook on the given points (with infinity); F(2x2) on 0, 1, -1
is dptrain's. Prints each variant's relative error ||y - y_ref|| / ||y_ref||, and the GEMM
multiplications per output pixel (the speed a larger tile would buy: (m + 2)(n + 2) / (m n)).
"""
import argparse
import itertools

import numpy as np


def to_bf16(a):
    """Rounds to the nearest bf16 (ties to even), returned as float64."""
    u = np.asarray(a, np.float32).copy().view(np.uint32)
    u += np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    u &= np.uint32(0xFFFF0000)
    return u.view(np.float32).astype(np.float64)


def toom_cook(points, m, r=3):
    """A^T (m x a), G (a x r), B^T (a x a) of F(m, r) on the finite points and infinity."""
    a = m + r - 1
    assert len(points) == a - 1
    at, g = np.zeros((m, a)), np.zeros((a, r))
    for j, p in enumerate(points):
        at[:, j] = [p**i for i in range(m)]
        g[j] = [p**k / np.prod([p - q for q in points if q != p]) for k in range(r)]
    at[m - 1, a - 1], g[a - 1, r - 1] = 1, 1
    # B^T solves sum_j A^T[i, j] G[j, k] B^T[j, l] = [l == i + k] for every i, k, l.
    eqs, rhs = [], []
    for i, k, l in itertools.product(range(m), range(r), range(a)):
        row = np.zeros((a, a))
        row[:, l] = at[i] * g[:, k]
        eqs.append(row.ravel())
        rhs.append(1.0 if l == i + k else 0.0)
    bt, *_ = np.linalg.lstsq(np.array(eqs), np.array(rhs), rcond=None)
    bt = bt.reshape(a, a)
    assert np.allclose(np.array(eqs) @ bt.ravel(), rhs)
    return at, g, bt


def winograd(x, w, rows, cols, rnd):
    """F(m x n, 3x3) of x (C, H, W) with w (K, C, 3, 3); rows/cols: (A^T, G, B^T) per axis."""
    (atr, gr, btr), (atc, gc, btc) = rows, cols
    m, n = atr.shape[0], atc.shape[0]
    c, h, wd = x.shape
    th, tw = -(-h // m), -(-wd // n)
    xp = np.pad(x, ((0, 0), (1, th * m - h + 1), (1, tw * n - wd + 1)))
    # Every tile at once: (C, tiles_y, tiles_x, m + 2, n + 2).
    tiles = np.lib.stride_tricks.sliding_window_view(xp, (m + 2, n + 2), axis=(1, 2))[:, ::m, ::n]
    v = rnd(np.einsum("ij,cyxjl,ml->cyxim", btr, tiles, btc))
    u = rnd(np.einsum("ij,kcjl,ml->kcim", gr, w, gc))
    prod = np.einsum("kcim,cyxim->kyxim", u, v)
    y = np.einsum("ij,kyxjl,ml->kyxim", atr, prod, atc)
    k = w.shape[0]
    return y.transpose(0, 1, 3, 2, 4).reshape(k, th * m, tw * n)[:, :h, :wd]


def direct(x, w):
    c, h, wd = x.shape
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1)))
    return sum(
        np.einsum("kc,chw->khw", w[:, :, i, j], xp[:, i:i + h, j:j + wd])
        for i in range(3) for j in range(3))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--channels", type=int, default=256)
    ap.add_argument("--size", type=int, default=8, help="image side (pixels)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    c = args.channels
    x = to_bf16(np.maximum(rng.standard_normal((c, args.size, args.size)), 0))
    w = rng.standard_normal((c, c, 3, 3)) * np.sqrt(2 / (9 * c))
    ref = direct(x, w)

    def error(y):
        return np.linalg.norm(y - ref) / np.linalg.norm(ref)

    f2 = toom_cook((0, 1, -1), 2)
    variants = [("direct bf16 (oneDNN)", None, None, 9.0),
                ("F(2x2) on 0, 1, -1 (dptrain)", f2, f2, 4.0)]
    for pts in [(0, 1, -1, 2), (0, 1, -1, 0.5)]:
        f3 = toom_cook(pts, 3)
        variants.append((f"F(2x3) on {pts}", f2, f3, 20 / 6))
        variants.append((f"F(3x3) on {pts}", f3, f3, 25 / 9))
    for pts in [(0, 1, -1, 2, -2), (0, 1, -1, 0.5, -0.5), (0, 1, -1, 0.5, -2)]:
        f4 = toom_cook(pts, 4)
        variants.append((f"F(2x4) on {pts}", f2, f4, 24 / 8))
        variants.append((f"F(4x4) on {pts}", f4, f4, 36 / 16))
    print(f"{c} -> {c} channels, {args.size}x{args.size}, inputs and tiles in bf16")
    print(f"{'variant':40} {'rel. error':>10} {'mult./pixel':>11}")
    for name, rows, cols, mults in variants:
        y = direct(x, to_bf16(w)) if rows is None else winograd(x, w, rows, cols, to_bf16)
        print(f"{name:40} {error(y):10.2e} {mults:11.2f}")
    exact = winograd(x, w, f2, toom_cook((0, 1, -1, 0.5, -2), 4), lambda a: a)
    print(f"{'(F(2x4) unrounded: the formula itself)':40} {error(exact):10.2e}")


if __name__ == "__main__":
    main()
