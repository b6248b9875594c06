#!/usr/bin/env python3
"""A PyTorch DistributedDataParallel trainer fed by meshload.

One process per rank, as torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT); each talks to the meshload sidecar of its pod
(MESHLOAD_SOCKET, set by the sidecar-injection webhook):

    pip install meshload torch      # or the wheel built from client/python
    torchrun --nproc-per-node 1 --nnodes 2 ... torch_ddp_trainer.py --steps 1000

The sidecar has already loaded exactly this rank's shard of each global
batch (the DataLoadJob's mesh: one device per process for DDP), so there is
no DistributedSampler and no DataLoader: `torch.from_dlpack` views the
staged slot without a copy, and the batch goes back to the sidecar when the
step's tensors are dropped.

The model is a toy (a linear probe over the bytes of each sample), so that the
example runs on CPUs with the gloo backend (--backend nccl on GPUs); the data
path is the real one. Each step prints one JSON line with the loss and the sum
of the bytes of the global batch (all-reduced; the checks compare it with the
planner's batches).
"""

import argparse
import json
import os
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", default="", help="the sidecar's socket (default: $MESHLOAD_SOCKET)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--backend", default="gloo", help="torch.distributed backend: gloo (CPU) or nccl (GPU)")
    ap.add_argument("--learning-rate", type=float, default=1e-3)
    args = ap.parse_args()

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import meshload

    dist.init_process_group(args.backend)
    device = torch.device("cuda", torch.cuda.current_device()) if args.backend == "nccl" else torch.device("cpu")
    with meshload.Client(args.socket) as client:
        if len(client.devices) != 1:
            raise SystemExit("DDP trains one device per process; job %r gives each process %d (spec.mesh)"
                             % (client.job, len(client.devices)))
        if client.mesh.processes != dist.get_world_size() or client.process != dist.get_rank():
            raise SystemExit("this is rank %d of %d, but its sidecar serves process %d of %d of job %r"
                             % (dist.get_rank(), dist.get_world_size(), client.process, client.mesh.processes,
                                client.job))
        model = None
        for _ in range(args.steps):
            batch = client.next()
            x = torch.from_dlpack(batch.tensors[0])          # this rank's shard, zero-copy
            if x.device != device:
                x = x.to(device, non_blocking=True)          # host staging on a GPU node: one copy
            features = x.reshape(x.shape[0], -1).float() / 255.0
            if model is None:
                model = DDP(torch.nn.Linear(features.shape[1], 1).to(device))
                opt = torch.optim.SGD(model.parameters(), lr=args.learning_rate)
            loss = torch.nn.functional.mse_loss(model(features).squeeze(1), features.mean(dim=1))
            opt.zero_grad()
            loss.backward()                                  # DDP all-reduces the gradients
            opt.step()
            total = x.to(torch.int64).sum().reshape(1)
            dist.all_reduce(total)
            if dist.get_rank() == 0:
                print(json.dumps({"step": batch.step, "loss": loss.item(), "batch_sum": int(total.item()),
                                  "wait_ms": round(batch.wait_seconds * 1e3, 3)}), flush=True)
            del x, features, batch
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
