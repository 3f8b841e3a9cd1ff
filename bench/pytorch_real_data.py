"""PyTorch peer of dptrain's "same recipe" on a real dataset: IoU and epoch time per epoch to compare.

The parity check of docs/real-data.md. Trains tools/reference/models.py's UNet16 (width divided by
--divisor) on a dptrain dataset v1 file (/train and /val: images uint8 [N,H,W,3] RGB, masks uint8
[N,H,W] in {0,1}) as

    mpirun -np 2 dptrain --data D.h5 --width-divisor 8 --batch-size 4 --threads 1 --lr 0.05 \
        --optimizer sgd --lr-schedule constant --loss bce --pos-weight none --normalize imagenet \
        --augment flips --init-weights init.h5

trains it: BCE with logits (mean over pixels, no pos_weight), SGD lr 0.05 constant, momentum 0.9,
weight decay 1e-4; inputs (pixel/255 - ImageNet mean) / ImageNet std; random horizontal and
vertical flips, p 0.5 each. --world processes (DistributedDataParallel over gloo, 1 thread each),
per-rank batch --batch, each rank its shard of the shuffled training set (DistributedSampler).
After every epoch the whole val split is scored at threshold 0.5 (logit > 0, as dptrain) from the
TP/FP/FN summed over all pixels and ranks. Same start as dptrain:

    /usr/bin/python3 bench/pytorch_real_data.py --save-init init.pt
    /usr/bin/python3 tools/pt_to_h5.py init.pt init.h5        # then dptrain --init-weights init.h5
    /usr/bin/python3 bench/pytorch_real_data.py --data /data/deepcrack.h5 --init init.pt --out runs/pt

Needs (Debian 12): apt-get install python3-torch python3-h5py. Prints one line per epoch;
--out DIR writes DIR/metrics.csv (seconds: the epoch's training part only; val_seconds apart).
"""
import argparse
import os
import sys
import tempfile
import time

import h5py
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools",
                                "reference"))
import models  # noqa: E402  (the reference models, dptrain's parameter names)

IMAGENET_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
IMAGENET_STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


def load_split(path, split):
    """Images uint8 NCHW and masks float N1HW of one split."""
    with h5py.File(path, "r") as f:
        if f.attrs.get("format") not in (b"dp-crack-v1", "dp-crack-v1"):
            raise SystemExit(f"{path} is not a dp-crack-v1 dataset")
        images = torch.from_numpy(f[f"{split}/images"][:]).permute(0, 3, 1, 2).contiguous()
        masks = torch.from_numpy(f[f"{split}/masks"][:]).unsqueeze(1).float()
    return images, masks


def normalize(images_uint8):
    return (images_uint8.float() / 255.0 - IMAGENET_MEAN) / IMAGENET_STD


def new_model(args):
    torch.manual_seed(args.seed)
    return models.make("unet16", width_divisor=args.divisor)


def validate(model, images, masks, rank, world, batch):
    """TP, FP, FN at p > 0.5 over this rank's share of the split, summed over all ranks."""
    counts = torch.zeros(3, dtype=torch.float64)
    model.eval()
    with torch.no_grad():
        mine = list(range(rank, len(images), world))
        for i in range(0, len(mine), batch):
            idx = mine[i:i + batch]
            pred = model(normalize(images[idx])) > 0
            truth = masks[idx] > 0.5
            counts += torch.tensor([(pred & truth).sum().item(), (pred & ~truth).sum().item(),
                                    (~pred & truth).sum().item()], dtype=torch.float64)
    model.train()
    dist.all_reduce(counts)
    return counts.tolist()


def ratio(num, den):
    return num / den if den > 0 else 0.0


def worker(rank, args, init_file):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=args.world)
    train_images, train_masks = load_split(args.data, "train")
    val_images, val_masks = load_split(args.data, "val")
    model = new_model(args)
    if args.init:
        sd = torch.load(args.init, map_location="cpu")
        model.load_state_dict(sd.get("model", sd))
    ddp = nn.parallel.DistributedDataParallel(model)  # broadcasts rank 0's weights
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    loss_fn = nn.BCEWithLogitsLoss()
    sampler = DistributedSampler(range(len(train_images)), num_replicas=args.world, rank=rank,
                                 shuffle=True, seed=args.seed, drop_last=False)
    flips = torch.Generator().manual_seed(args.seed * 1000 + rank)
    csv = None
    if rank == 0:
        print(f"{args.data}: train {tuple(train_images.shape)}, val {tuple(val_images.shape)}, "
              f"world {args.world} x batch {args.batch}, torch {torch.__version__}", flush=True)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            csv = open(os.path.join(args.out, "metrics.csv"), "w")
            csv.write("epoch,train_loss,iou,precision,recall,seconds,val_seconds\n")
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        order = list(sampler)
        loss_sum = torch.zeros(2, dtype=torch.float64)  # sum of pixel losses, pixels
        dist.barrier()
        t0 = time.perf_counter()
        for i in range(0, len(order), args.batch):
            idx = order[i:i + args.batch]
            x, y = train_images[idx].clone(), train_masks[idx].clone()
            for j in range(len(idx)):
                if torch.rand(1, generator=flips).item() < 0.5:
                    x[j], y[j] = x[j].flip(-1), y[j].flip(-1)
                if torch.rand(1, generator=flips).item() < 0.5:
                    x[j], y[j] = x[j].flip(-2), y[j].flip(-2)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(normalize(x)), y)
            loss.backward()
            opt.step()
            loss_sum += torch.tensor([loss.item() * y.numel(), y.numel()], dtype=torch.float64)
        dist.barrier()
        seconds = time.perf_counter() - t0
        t1 = time.perf_counter()
        tp, fp, fn = validate(model, val_images, val_masks, rank, args.world, args.batch)
        val_seconds = time.perf_counter() - t1
        dist.all_reduce(loss_sum)
        train_loss = ratio(loss_sum[0].item(), loss_sum[1].item())
        iou, precision, recall = ratio(tp, tp + fp + fn), ratio(tp, tp + fp), ratio(tp, tp + fn)
        if rank == 0:
            print(f"epoch {epoch}/{args.epochs}  train_loss {train_loss:.4f}  iou {iou:.4f}  "
                  f"precision {precision:.4f}  recall {recall:.4f}  train {seconds:.1f} s  "
                  f"val {val_seconds:.1f} s", flush=True)
            if csv:
                csv.write(f"{epoch},{train_loss:.6f},{iou:.6f},{precision:.6f},{recall:.6f},"
                          f"{seconds:.3f},{val_seconds:.3f}\n")
                csv.flush()
    if csv:
        csv.close()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="dataset v1 HDF5 file (needed unless --save-init)")
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--seed", type=int, default=42, help="initial weights, shuffle, flips")
    ap.add_argument("--world", type=int, default=2, help="processes (1 thread each)")
    ap.add_argument("--batch", type=int, default=4, help="per process")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--divisor", type=int, default=8, help="width divisor (dptrain --width-divisor)")
    ap.add_argument("--out", help="folder for metrics.csv")
    ap.add_argument("--init", help="start from this state_dict (.pt)")
    ap.add_argument("--save-init", metavar="PT",
                    help="write the seeded initial state_dict here and exit")
    args = ap.parse_args()
    if args.save_init:
        torch.save(new_model(args).state_dict(), args.save_init)
        print(f"{args.save_init}: unet16 /{args.divisor}, seed {args.seed}")
        return
    if not args.data:
        ap.error("--data is required (or --save-init)")
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(args, os.path.join(tmp, "init")), nprocs=args.world)


if __name__ == "__main__":
    main()
