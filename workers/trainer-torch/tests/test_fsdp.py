"""Parameter sharding with FullyShardedDataParallel (server.py --nproc 2 --sharding fsdp, gloo on CPU): the same
weights as one rank, shards of every parameter in each rank's optimizer file, a resume from the shards that
writes byte-identical files, and the weights gathered on rank 0 for trainer_push. Both FSDP2 (fully_shard,
what --sharding fsdp runs on the suite's torch) and FSDP1 (--sharding fsdp1) run on 2 gloo ranks."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import urllib.request

from helpers import INSTALL, BatchServer, TrainerProcess, make_batch, request, require

require("torch")

from test_distributed import CONFIG, _free_port, read, single_rank, tensors  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def resolved_impl():
    """What --sharding fsdp runs on this torch: fsdp2 where it has fully_shard, else fsdp1."""
    from rlq_torch.fsdp import resolve

    return resolve("fsdp")


class FsdpTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from rlq_torch.fsdp import fsdp_unavailable

        why = fsdp_unavailable()
        if why:
            raise RuntimeError(
                f"{why}; `{INSTALL}` builds the suite's environment (python/requirements.lock)"
            )
        cls.batches = BatchServer()
        cls.tmp = tempfile.mkdtemp(prefix="rlq-fsdp-test-")
        cls.engine_proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "fake_push_engine.py"), "--port", "0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        cls.engine = f"http://127.0.0.1:{cls.engine_proc.stdout.readline().split()[1]}"

    @classmethod
    def tearDownClass(cls):
        cls.engine_proc.kill()
        cls.engine_proc.wait()
        cls.engine_proc.stdout.close()
        cls.batches.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def out(self, *parts):
        d = os.path.join(self.tmp, *parts)
        os.makedirs(d, exist_ok=True)
        return d

    def train(self, trainer, run, step, attempt, uri=None):
        batch = make_batch(run, step, groups=4, per_group=4, seed=step + 1)
        url = self.batches.add(f"{run}-{step}-{attempt}", batch)
        code, st = trainer.call(
            "POST",
            "/v1/steps",
            request(
                run,
                step,
                attempt,
                self.out(run, str(step), attempt),
                url,
                CONFIG,
                uri=uri,
            ),
        )
        self.assertEqual(code, 202, st)
        st = trainer.wait(run, step, timeout=300)
        self.assertEqual(st["state"], "done", st)
        return batch, st

    def assert_close_weights(self, a, b, atol=1e-5):
        import torch

        wa, wb = (
            tensors(f"{a}/weights.safetensors"),
            tensors(f"{b}/weights.safetensors"),
        )
        self.assertEqual(sorted(wa), sorted(wb))
        for n in wa:
            self.assertEqual(wa[n].shape, wb[n].shape, n)
            self.assertTrue(
                torch.allclose(wa[n], wb[n], atol=atol, rtol=0),
                f"{n}: max diff {float((wa[n] - wb[n]).abs().max())}",
            )

    def test_two_fsdp2_ranks_train_the_one_rank_weights_resume_from_their_shards_and_push(
        self,
    ):
        """--sharding fsdp: FSDP2 (fully_shard), which the suite's torch has."""
        self.assertEqual(
            resolved_impl(),
            "fsdp2",
            f"this torch has no fully_shard; `{INSTALL}` builds the suite's environment",
        )
        self.check_sharding("fsdp", "fsdp2")

    def test_fsdp1_forced(self):
        """--sharding fsdp1: FullyShardedDataParallel, also where torch has FSDP2."""
        self.check_sharding("fsdp1", "fsdp1")

    def check_sharding(self, mode, impl):
        import torch

        run = mode
        a = TrainerProcess(
            "--nproc",
            "2",
            "--sharding",
            mode,
            "--push-engines",
            self.engine,
            "--push-backend",
            "gloo",
            "--push-master-port",
            str(_free_port()),
        )
        try:
            _, health = a.call("GET", "/v1/health")
            self.assertEqual(
                (health["distributed"]["sharding"], health["distributed"]["fsdp"]),
                (mode, impl),
            )
            b0, st0 = self.train(a, run, 0, "a")
            s0 = self.out(run, "0", "a")
            b1, st1 = self.train(
                a, run, 1, "held", uri=f"file://{s0}"
            )  # from the shards the ranks hold
        finally:
            a.close()
        one0, one1 = self.out(run, "ref0"), self.out(run, "ref1")
        single_rank(one0, b0)
        single_rank(one1, b1, uri=f"file://{one0}")
        self.assert_close_weights(s0, one0)
        self.assert_close_weights(self.out(run, "1", "held"), one1)
        # each rank's optimizer file holds its shard of every parameter (FSDP1: flat pieces; FSDP2: dim-0 chunks), marked so
        from rlq_torch.safetensors_io import read_safetensors

        shards = [
            read_safetensors(f"{s0}/optimizer-0000{k}-of-00002.safetensors")
            for k in (1, 2)
        ]
        marked = {"fsdp1": "fsdp", "fsdp2": "fsdp2"}[impl]
        self.assertEqual([m.get("sharding") for m, _ in shards], [marked, marked])
        full = tensors(f"{s0}/weights.safetensors")
        for n, t in full.items():
            self.assertEqual(
                sum(ts[f"exp_avg.{n}"].numel() for _, ts in shards), t.numel(), n
            )
        # trainer_push: rank 0 gathered the whole weights of version 2 and pushed them
        push = st1["result"]["weight_push"]
        self.assertNotIn("error", push)
        with urllib.request.urlopen(f"{self.engine}/received", timeout=30) as r:
            got = json.loads(r.read())
        self.assertEqual(got["version"], "2")
        for n, t in tensors(
            f"{self.out(run, '1', 'held')}/weights.safetensors"
        ).items():
            self.assertEqual(
                got["tensors"][n]["values"], t.to(torch.float64).flatten().tolist(), n
            )
        # a fresh fsdp group resumes from the shards: byte-identical files
        b = TrainerProcess("--nproc", "2", "--sharding", mode)
        try:
            self.train(b, run, 1, "disk", uri=f"file://{s0}")
        finally:
            b.close()
        held, disk = self.out(run, "1", "held"), self.out(run, "1", "disk")
        self.assertEqual(sorted(os.listdir(held)), sorted(os.listdir(disk)))
        for f in os.listdir(held):
            self.assertEqual(read(f"{held}/{f}"), read(f"{disk}/{f}"), f)
        # one rank (zero1) refuses fsdp shards instead of misreading them
        with self.assertRaises(Exception) as e:
            single_rank(self.out(run, "cross"), b1, uri=f"file://{s0}")
        self.assertIn("fsdp", str(e.exception))


class FsdpFlagTest(unittest.TestCase):
    """Runs everywhere: --sharding fsdp is refused at startup, with the reason, where it cannot work."""

    def server(self, *args):
        return subprocess.run(
            [
                sys.executable,
                os.path.join(os.path.dirname(HERE), "server.py"),
                "--port",
                "0",
                "--device",
                "cpu",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )

    def test_fsdp_needs_two_ranks(self):
        r = self.server("--sharding", "fsdp")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--sharding fsdp shards over ranks: it needs --nproc", r.stderr)

    def test_optimizer_shards_say_how_they_were_sharded(self):
        """fsdp shards (flat pieces of every parameter) are read only by a group of the same size and mode; a
        zero1 or one-rank reader refuses them, and zero1 files carry no sharding key (their bytes are unchanged)."""
        import torch
        from rlq_torch.models import CheckpointError, read_optimizer, write_optimizer
        from rlq_torch.safetensors_io import read_safetensors

        with (
            tempfile.TemporaryDirectory() as fsdp_dir,
            tempfile.TemporaryDirectory() as zero1_dir,
        ):
            for rank in (0, 1):
                piece = torch.full((3,), float(rank))
                write_optimizer(
                    fsdp_dir,
                    [("w", piece)],
                    {"w": (piece, piece + 1)},
                    5,
                    2,
                    "r",
                    1,
                    {},
                    shard=(rank, 2),
                    sharding="fsdp",
                )
                write_optimizer(
                    zero1_dir,
                    [(f"w{rank}", piece)],
                    {f"w{rank}": (piece, piece)},
                    5,
                    2,
                    "r",
                    1,
                    {},
                    shard=(rank, 2),
                )
            iteration, moments, _ = read_optimizer(
                fsdp_dir, ["w"], shard=(1, 2), sharding="fsdp"
            )
            self.assertEqual(
                (iteration, moments["w"][0].tolist(), moments["w"][1].tolist()),
                (5, [1.0] * 3, [2.0] * 3),
            )
            for reader in (
                {},
                {"shard": (0, 2)},
                {"shard": (0, 4), "sharding": "fsdp"},
            ):
                with (
                    self.subTest(reader=reader),
                    self.assertRaises(CheckpointError) as e,
                ):
                    read_optimizer(fsdp_dir, ["w"], **reader)
                self.assertIn("fsdp", str(e.exception))
            with self.assertRaises(CheckpointError):
                read_optimizer(zero1_dir, ["w0"], shard=(0, 2), sharding="fsdp")
            self.assertNotIn(
                "sharding",
                read_safetensors(f"{zero1_dir}/optimizer-00001-of-00002.safetensors")[
                    0
                ],
            )
            self.assertEqual(read_optimizer(zero1_dir, ["w0", "w1"])[0], 5)


if __name__ == "__main__":
    unittest.main()
