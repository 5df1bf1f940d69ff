"""Colocated mode's moves (rlq_torch/offload.py) on an FSDP2-sharded model: the offload and onload must
leave every FSDP2 parameter group's all-gather source on the moved tensors. A move between devices
makes new tensors; on the CPU a move to another dtype does the same, so the test moves with a dtype."""

import os
import unittest
from types import SimpleNamespace

from helpers import require

require("torch")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from test_distributed import _free_port  # noqa: E402
from torch import nn  # noqa: E402


class _Inner(nn.Module):
    """The policy's module: an embedding (the root group's, as an HF model's) and layers sharded on their own."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])


class _Forward(nn.Module):
    """Stands for trainer._Forward: the policy's module as ``inner``, sharded last (the root)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner


def _stale_groups(root: nn.Module) -> list[str]:
    """The FSDP2 parameters whose all-gather source is not the registered parameter's storage."""
    out = []
    for m in root.modules():
        state = getattr(m, "_get_fsdp_state", None)
        if state is None:
            continue
        for group in state()._fsdp_param_groups:
            for p in group.fsdp_params:
                info = p._module_info
                local = getattr(info.module, info.param_name)._local_tensor
                src = p._sharded_param_data
                if (
                    src.dtype != local.dtype
                    or src.untyped_storage().data_ptr()
                    != local.untyped_storage().data_ptr()
                ):
                    out.append(f"{type(info.module).__name__}.{info.param_name}")
    return out


class Fsdp2MovesTest(unittest.TestCase):
    def setUp(self):
        from rlq_torch.fsdp import resolve

        if resolve("fsdp") != "fsdp2":
            raise RuntimeError(
                "this torch has no fully_shard; the suite's torch (python/requirements.lock) does"
            )
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(_free_port())
        dist.init_process_group("gloo", rank=0, world_size=1)
        self.addCleanup(lambda: dist.is_initialized() and dist.destroy_process_group())

    def sharded(self):
        from rlq_torch.fsdp import wrap

        inner = _Inner()
        inner._no_split_modules = [
            "Linear"
        ]  # fsdp.py shards the classes an HF model names here
        root = wrap(_Forward(inner), torch.device("cpu"), "fsdp2")
        held = SimpleNamespace(
            policy=SimpleNamespace(module=inner), moments={}, critic=None
        )
        return root, held

    def test_moving_the_root_keeps_every_group_on_the_moved_tensors(self):
        from rlq_torch.offload import move_held

        root, held = self.sharded()
        moved = move_held(held, torch.float64, root)
        self.assertEqual(_stale_groups(root), [])
        self.assertEqual(held.policy.module.embed.weight.dtype, torch.float64)
        n = sum(p.numel() for p in held.policy.module.parameters())
        self.assertEqual(moved, 8 * n)
        # What a move of the policy's module alone does (the root left out): the root's group, the
        # embedding, keeps gathering from its old storage.
        root, held = self.sharded()
        move_held(held, torch.float64)
        self.assertEqual(_stale_groups(root), ["Embedding.weight"])


if __name__ == "__main__":
    unittest.main()
