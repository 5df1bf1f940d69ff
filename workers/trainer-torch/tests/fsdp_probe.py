"""Can this torch run FSDP on CPU with gloo? Two processes shard a Linear and run a forward and backward.

    python3 fsdp_probe.py PORT fsdp1|fsdp2

Exit 0 when it ran; 3 with the reason on stdout when it cannot. A file, not ``python -c``: the spawned
ranks import their function from this module by path (torch.multiprocessing's spawn start method)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rank(r, port, impl):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=r, world_size=2)
    m = torch.nn.Linear(4, 2)
    if impl == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh

        from rlq_torch.fsdp import _fully_shard

        _fully_shard()[0](m, mesh=init_device_mesh("cpu", (2,)))
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel

        m = FullyShardedDataParallel(m, use_orig_params=True, device_id=torch.device("cpu"))
    m(torch.ones(3, 4)).sum().backward()
    dist.barrier()
    dist.destroy_process_group()


def main():
    port, impl = sys.argv[1], sys.argv[2]
    from rlq_torch.fsdp import _fully_shard, fsdp_unavailable

    why = fsdp_unavailable()
    if why:
        print(why)
        sys.exit(3)
    import torch
    import torch.multiprocessing as mp

    if impl == "fsdp2" and _fully_shard() is None:
        print(f"torch {torch.__version__} has no fully_shard (FSDP2 needs torch >= 2.4)")
        sys.exit(3)
    try:
        mp.spawn(rank, args=(port, impl), nprocs=2)
    except Exception as e:  # noqa: BLE001
        print(f"torch {torch.__version__}: {impl} does not run on CPU with gloo: {type(e).__name__}: {str(e)[-600:]}")
        sys.exit(3)


if __name__ == "__main__":
    main()
