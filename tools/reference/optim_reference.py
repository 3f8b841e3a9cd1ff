#!/usr/bin/env python3
"""Reference numbers for tests/unit/test_optim.cpp from PyTorch (AdamW, clip_grad_norm_, LR
schedules). Run once with /usr/bin/python3 (torch 1.13); the test hard-codes the printed values."""
import math

import torch


def adamw():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.tensor([0.5, -1.25, 2.0, 0.0, -0.75], dtype=torch.float64))
    opt = torch.optim.AdamW([p], lr=0.1, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05)
    grads = [[0.3, -0.2, 1.5, 0.0, -4.0], [-0.1, 0.4, 1.0, 2.0, -3.0], [0.2, 0.2, -0.5, 1.0, 0.5]]
    for g in grads:
        p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
    st = opt.state[p]
    print("// AdamW lr 0.1, betas (0.9, 0.99), eps 1e-8, weight_decay 0.05, 3 steps, float64")
    print("params", [f"{v:.10g}" for v in p.detach().tolist()])
    print("exp_avg", [f"{v:.10g}" for v in st["exp_avg"].tolist()])
    print("exp_avg_sq", [f"{v:.10g}" for v in st["exp_avg_sq"].tolist()])


def clip():
    a = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    b = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    a.grad = torch.tensor([3.0, 0.0, -4.0], dtype=torch.float64)
    b.grad = torch.tensor([12.0, 0.0], dtype=torch.float64)
    norm = torch.nn.utils.clip_grad_norm_([a, b], max_norm=6.5)
    print("// clip_grad_norm_ max_norm 6.5 of [3,0,-4] and [12,0]")
    print("norm", f"{norm.item():.10g}", "grads",
          [f"{v:.10g}" for v in torch.cat([a.grad, b.grad]).tolist()])


def schedules():
    base, epochs, warmup = 0.1, 10, 3
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=base)
    sched = torch.optim.lr_scheduler.SequentialLR(
        opt,
        [torch.optim.lr_scheduler.LinearLR(opt, start_factor=1 / (warmup + 1), total_iters=warmup),
         torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs - warmup, eta_min=0)],
        milestones=[warmup])
    lrs = []
    for _ in range(epochs):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    print(f"// cosine, base {base}, {epochs} epochs, {warmup} warm-up (LinearLR + CosineAnnealingLR)")
    print("lrs", [f"{v:.10g}" for v in lrs])
    opt = torch.optim.SGD([p], lr=base)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    lrs = []
    for _ in range(7):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    print("// StepLR step_size 3, gamma 0.5")
    print("lrs", [f"{v:.10g}" for v in lrs])
    opt = torch.optim.SGD([p], lr=base)  # cooldown: 7 epochs constant, 3 decaying to 1/4
    sched = torch.optim.lr_scheduler.SequentialLR(
        opt,
        [torch.optim.lr_scheduler.ConstantLR(opt, factor=1.0, total_iters=7),
         torch.optim.lr_scheduler.LinearLR(opt, start_factor=3 / 4, end_factor=1 / 4,
                                           total_iters=2)],
        milestones=[7])
    lrs = []
    for _ in range(epochs):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    print("// cooldown, base 0.1, 10 epochs, the last 3 decaying (ConstantLR + LinearLR)")
    print("lrs", [f"{v:.10g}" for v in lrs])


if __name__ == "__main__":
    adamw()
    clip()
    schedules()
    print("// sqrt scaling of 6:", math.sqrt(6))
