"""torch.distributed with the "pyccl" backend on a group that spans nodes,
launched by torchrun unchanged. On each node (``MASTER``: node 0's address)::

    torchrun --nnodes 2 --nproc-per-node 4 --node-rank $NODE_RANK \\
        --rdzv-backend c10d --rdzv-endpoint $MASTER:29500 examples/torchrun/across_nodes.py

all_reduce, all_gather_into_tensor and reduce_scatter_tensor run on pyccl's
collectives across nodes (2PH: NVLink inside a node, TCP between); other ops
go to the group's NCCL. Without GPUs the same runs in host mode ("cpu:pyccl").
One machine can play both nodes: give each torchrun its own PYCCL_NODE_ID.
Each rank checks its results against float64 and prints one line.
"""

import os
import socket

import torch
import torch.distributed as dist

import pyccl  # noqa: F401  (registers the backend; torch also loads it on start)


def main() -> None:
    on_gpu = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if on_gpu:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("pyccl" if on_gpu else "cpu:pyccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank) if on_gpu else torch.device("cpu")
    gen = torch.Generator().manual_seed(1234)
    inputs = [torch.randn(3 * world * 1000 + world, generator=gen, dtype=torch.float64) for _ in range(world)]
    reference = torch.stack(inputs).sum(0)

    x = inputs[rank].to(device, torch.float32)
    dist.all_reduce(x)
    errors = [float((x.cpu().double() - reference).abs().max())]
    gathered = torch.empty(world * x.numel(), device=device)
    dist.all_gather_into_tensor(gathered, inputs[rank].to(device, torch.float32))
    errors.append(float((gathered.cpu().double() - torch.cat(inputs)).abs().max()))
    part = x.numel() // world
    shard = torch.empty(part, device=device)
    dist.reduce_scatter_tensor(shard, inputs[rank].to(device, torch.float32))
    errors.append(float((shard.cpu().double() - reference[rank * part:(rank + 1) * part]).abs().max()))
    dist.barrier()
    ok = max(errors) < 1e-3
    node = os.environ.get("PYCCL_NODE_ID") or socket.gethostname()
    print(f"rank {rank}/{world} node {node}: "
          f"{'ok' if ok else 'WRONG'} (max errors {errors})", flush=True)
    dist.destroy_process_group()
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
