"""Data-parallel training under torchrun (server.py --nproc N, gloo on CPU): the same weights as one rank,
sharded optimizer state that resumes bit-identically, a killed rank failing the attempt retriably, and
rank 0 pushing each trained version to an engine (trainer_push).

Starting a process group is most of what these tests cost (torchrun and N interpreters importing
torch), so the tests that only need a warm 2-rank group share one (``cls.two``, which also pushes every
version it trains to the stand-in engine); the ones that kill a group or need a fresh one start their own,
and the killed group's retry doubles as the resume-from-shards check."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

from helpers import (
    INSTALL,
    TINY_MODEL,
    BatchServer,
    TrainerProcess,
    make_batch,
    request,
    require,
)

require("torch")

HERE = os.path.dirname(os.path.abspath(__file__))

# Gradients are summed in another order across ranks (DDP's all-reduce), so weights agree to float
# rounding amplified by Adam's 1/sqrt(v) on near-zero gradients (as micro-batching does: test_trainer.py).
ATOL = 1e-5
CONFIG = {"max_tokens_per_gpu": 40, "global_batch_size": 8, "seed": 7}


def single_rank(out, batch, uri=None, v_in=None, **config):
    """The reference: the same step in this process, one rank."""
    from rlq_torch.trainer import TorchTrainer, parse_algorithm, parse_train_config

    r = request(
        batch.run_id,
        batch.step,
        "0",
        out,
        "http://unused",
        {**CONFIG, **config},
        v_in=v_in,
        uri=uri,
    )
    tr = TorchTrainer("cpu", {"model": TINY_MODEL})
    t = parse_train_config(r["config"], tr.defaults)
    return tr.train_step(
        r, batch, t, parse_algorithm(r["config"]), lambda *a: None, lambda: None
    )


def tensors(path):
    from rlq_torch.safetensors_io import read_safetensors

    return read_safetensors(path)[1]


def merged_optimizer(d):
    from rlq_torch.models import optimizer_files

    out = {}
    for f in optimizer_files(d):
        for n, t in tensors(f).items():
            assert n not in out, f"{n} is in two shards"
            out[n] = t
    return out


def read(path):
    with open(path, "rb") as f:
        return f.read()


class DistributedTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_gloo_available():
            raise RuntimeError(
                f"this torch has no torch.distributed with gloo; `{INSTALL}` builds the suite's environment (python/requirements.lock)"
            )
        cls.batches = BatchServer()
        cls.tmp = tempfile.mkdtemp(prefix="rlq-dist-test-")
        cls.engine_proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "fake_push_engine.py"), "--port", "0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        cls.engine = f"http://127.0.0.1:{cls.engine_proc.stdout.readline().split()[1]}"
        cls.two = TrainerProcess(
            "--nproc",
            "2",
            "--push-engines",
            cls.engine,
            "--push-backend",
            "gloo",
            "--push-master-port",
            str(_free_port()),
        )

    @classmethod
    def tearDownClass(cls):
        cls.two.close()
        cls.engine_proc.kill()
        cls.engine_proc.wait()
        cls.engine_proc.stdout.close()
        cls.batches.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def out(self, *parts):
        d = os.path.join(self.tmp, *parts)
        os.makedirs(d, exist_ok=True)
        return d

    def assert_close_checkpoints(self, a, b, atol=ATOL):
        import torch

        wa, wb = (
            tensors(f"{a}/weights.safetensors"),
            tensors(f"{b}/weights.safetensors"),
        )
        self.assertEqual(list(wa), list(wb))
        for n in wa:
            self.assertTrue(
                torch.allclose(wa[n], wb[n], atol=atol, rtol=0),
                f"{n}: max diff {float((wa[n] - wb[n]).abs().max())}",
            )
        oa, ob = merged_optimizer(a), merged_optimizer(b)
        self.assertEqual(sorted(oa), sorted(ob))
        for n in oa:
            self.assertTrue(torch.allclose(oa[n], ob[n], atol=atol, rtol=1e-4), n)

    def train(self, trainer, run, step, attempt, uri=None, seed=None, **config):
        batch = make_batch(
            run, step, groups=4, per_group=4, seed=step + 1 if seed is None else seed
        )
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
                {**CONFIG, **config},
                uri=uri,
            ),
        )
        self.assertEqual(code, 202, st)
        return batch, trainer.wait(run, step, timeout=300)

    def close_and_check_no_orphans(self, trainer):
        """SIGKILL the front: every rank of its group must exit on its own (no orphaned group)."""
        _, health = trainer.call("GET", "/v1/health")
        pids = [r["pid"] for r in health["distributed"]["ranks"]]
        trainer.close()
        deadline = time.time() + 60
        while any(_alive(p) for p in pids) and time.time() < deadline:
            time.sleep(0.1)
        self.assertEqual(
            [p for p in pids if _alive(p)], [], "ranks outlived their front"
        )

    def check_world(self, n, trainer, chained: bool):
        """A step on n ranks equals the step on one rank and one rank resumes from the n-rank shards; with
        ``chained``, a second step from the weights and moments the ranks hold equals one rank's too."""
        run = f"w{n}"
        b0, st0 = self.train(trainer, run, 0, "a")
        self.assertEqual(st0["state"], "done", st0)
        self.assertEqual(st0["result"]["metrics"]["train_world_size"], n)
        s0 = self.out(run, "0", "a")
        # sharded: one optimizer file per rank, every parameter's moments in exactly one of them
        shards = sorted(f for f in os.listdir(s0) if f.startswith("optimizer-"))
        self.assertEqual(len(shards), n)
        self.assertFalse(os.path.exists(f"{s0}/optimizer.safetensors"))
        one0 = self.out(run, "ref0")
        r0 = single_rank(one0, b0)
        self.assert_close_checkpoints(s0, one0)
        self.assertAlmostEqual(
            st0["result"]["metrics"]["pg_loss"], r0["metrics"]["pg_loss"], delta=1e-6
        )
        b1 = make_batch(
            run, 1, groups=4, per_group=4, seed=2
        )  # what self.train(trainer, run, 1, ...) sends
        one1 = self.out(run, "ref1")
        single_rank(one1, b1, uri=f"file://{one0}")
        # world-size independence: one rank resumes from the N-rank shards
        cross = self.out(run, "cross1")
        single_rank(cross, b1, uri=f"file://{s0}")
        self.assert_close_checkpoints(cross, one1)
        if chained:
            _, st1 = self.train(
                trainer, run, 1, "a", uri=f"file://{s0}"
            )  # from the weights and moments held by the ranks
            self.assertEqual(st1["state"], "done", st1)
            self.assertEqual(st1["result"]["metrics"]["train_world_size"], n)
            self.assert_close_checkpoints(self.out(run, "1", "a"), one1)

    def test_two_ranks_train_the_one_rank_weights_and_rank_0_pushes_them(self):
        """trainer_push with --nproc 2: the front holds no weights; rank 0 joins the engine's push group (a group
        of its own beside the training group) and broadcasts every tensor of each version it trains."""
        import torch

        self.check_world(2, self.two, chained=True)
        _, st1 = self.two.call("GET", "/v1/steps/w2/1")
        push = st1["result"]["weight_push"]
        self.assertNotIn("error", push)
        self.assertEqual(push["version"], 2)
        with urllib.request.urlopen(f"{self.engine}/received", timeout=30) as r:
            got = json.loads(r.read())
        self.assertEqual(got["version"], "2")
        self.assertEqual(got["calls"][-1], "continue_generation")
        weights = tensors(f"{self.out('w2', '1', 'a')}/weights.safetensors")
        self.assertEqual(sorted(got["tensors"]), sorted(weights))
        self.assertEqual(push["tensors"], len(weights))
        for name, t in weights.items():
            self.assertEqual(
                got["tensors"][name]["values"],
                t.to(torch.float64).flatten().tolist(),
                name,
            )

    def test_four_ranks_train_the_one_rank_weights(self):
        trainer = TrainerProcess("--nproc", "4")
        try:
            self.check_world(4, trainer, chained=False)
            self.close_and_check_no_orphans(trainer)
        finally:
            trainer.close()

    def test_ppo_on_two_ranks_trains_the_one_rank_policy_and_critic(self):
        """The critic is data parallel too: DDP over the value net, sharded critic optimizer state (critic/optimizer-K-of-N)."""
        import torch

        ppo = {
            "advantage_estimator": "ppo",
            "value_clip": 0.5,
            "lambd": 0.95,
            "critic_lr": 3e-3,
        }
        trainer = self.two
        run = "ppo2"
        b0, st0 = self.train(trainer, run, 0, "a", **ppo)
        self.assertEqual(st0["state"], "done", st0)
        s0 = self.out(run, "0", "a")
        b1, st1 = self.train(trainer, run, 1, "a", uri=f"file://{s0}", **ppo)
        self.assertEqual(st1["state"], "done", st1)
        s1 = self.out(run, "1", "a")
        self.assertEqual(
            sorted(os.listdir(f"{s1}/critic")),
            [
                "optimizer-00001-of-00002.safetensors",
                "optimizer-00002-of-00002.safetensors",
                "weights.safetensors",
            ],
        )
        one0, one1 = self.out(run, "ref0"), self.out(run, "ref1")
        r0 = single_rank(one0, b0, **ppo)
        r1 = single_rank(one1, b1, uri=f"file://{one0}", **ppo)
        for mine, ref in ((s0, one0), (s1, one1)):
            self.assert_close_checkpoints(mine, ref)
            self.assert_close_checkpoints(f"{mine}/critic", f"{ref}/critic")
        for k in ("value_loss", "value_clipfrac", "pg_loss"):
            self.assertAlmostEqual(
                st1["result"]["metrics"][k], r1["metrics"][k], delta=1e-5, msg=k
            )
        self.assertAlmostEqual(
            st0["result"]["metrics"]["value_loss"],
            r0["metrics"]["value_loss"],
            delta=1e-6,
        )
        self.assertTrue(
            bool(
                torch.any(
                    tensors(f"{s1}/critic/weights.safetensors")["value_head.weight"]
                    != 0
                )
            )
        )

    def test_two_nodes_on_one_machine(self):
        """--nnodes 2: the front's node holds rank 0, node.py runs node 1's rank (static rendezvous); same weights as one rank."""
        import socket
        import subprocess
        import sys

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        node = subprocess.Popen(
            [
                sys.executable,
                os.path.join(
                    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    "node.py",
                ),
                "--nnodes",
                "2",
                "--node-rank",
                "1",
                "--nproc",
                "1",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                "--device",
                "cpu",
                "--threads",
                "1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        trainer = TrainerProcess(
            "--nproc", "1", "--nnodes", "2", "--master-port", str(port)
        )
        try:
            run = "nodes"
            b0, st0 = self.train(trainer, run, 0, "a")
            self.assertEqual(st0["state"], "done", st0)
            self.assertEqual(st0["result"]["metrics"]["train_world_size"], 2)
            _, health = trainer.call("GET", "/v1/health")
            self.assertEqual(
                (health["distributed"]["world_size"], health["distributed"]["nnodes"]),
                (2, 2),
            )
            ref = self.out(run, "ref0")
            single_rank(ref, b0)
            self.assert_close_checkpoints(self.out(run, "0", "a"), ref)
        finally:
            trainer.proc.send_signal(
                signal.SIGTERM
            )  # a graceful front stops its torchrun (a SIGKILLed one leaves the agent in its exit barrier)
            try:
                trainer.proc.wait(30)
            finally:
                trainer.close()
            node.send_signal(signal.SIGTERM)
            try:
                node.wait(30)
            except subprocess.TimeoutExpired:
                node.kill()
                node.wait()

    def test_a_rank_killed_mid_step_fails_retriably_and_the_retry_resumes_from_the_shards_bit_identically(
        self,
    ):
        """Step 1 of a run, from step 0's sharded files: trained from memory on the shared group ("held"), then on
        a fresh group whose rank 1 is SIGKILLed mid-step (the attempt fails retriably, the whole group is gone),
        then retried on another fresh group that reloads the weights and each rank's shard from the files:
        byte-identical to the step trained from memory, and committed once."""
        run = "kill"
        _, st = self.train(self.two, run, 0, "a")
        self.assertEqual(st["state"], "done", st)
        s0 = self.out(run, "0", "a")
        b1, st = self.train(
            self.two, run, 1, "held", uri=f"file://{s0}"
        )  # held in the ranks' memory
        self.assertEqual(st["state"], "done", st)
        url = self.batches.add(f"{run}-1-retry", b1)
        trainer = TrainerProcess("--nproc", "2", "--debug-rank-delay-s", "0.4")
        try:
            code, st = trainer.call(
                "POST",
                "/v1/steps",
                request(
                    run,
                    1,
                    "1",
                    self.out(run, "1", "1"),
                    url,
                    CONFIG,
                    uri=f"file://{s0}",
                ),
            )
            self.assertEqual(code, 202)
            st = trainer.wait(run, 1, states=("running",))
            deadline = time.time() + 120
            while (
                not st["progress"]["phase"].startswith("train")
                and st["state"] == "running"
                and time.time() < deadline
            ):
                time.sleep(0.05)
                _, st = trainer.call("GET", f"/v1/steps/{run}/1")
            self.assertTrue(st["progress"]["phase"].startswith("train"), st)
            _, health = trainer.call("GET", "/v1/health")
            ranks = health["distributed"]["ranks"]
            self.assertEqual([r["rank"] for r in ranks], [0, 1])
            os.kill(ranks[1]["pid"], signal.SIGKILL)
            st = trainer.wait(run, 1)
            self.assertEqual(st["state"], "failed", st)
            self.assertEqual(st["error"]["code"], "internal")
            self.assertTrue(st["error"]["retryable"])
            self.assertFalse(
                os.path.exists(
                    os.path.join(self.tmp, run, "1", "1", "weights.safetensors")
                )
            )
            for r in ranks:  # the whole group is gone, not just the killed rank
                self.assertFalse(_alive(r["pid"]), r)
            _, health = trainer.call("GET", "/v1/health")
            self.assertIsNone(health["weight_version"])
            # the retry (a new attempt) starts a fresh group, which reloads step 0 from the files, and trains the step once
            code, st = trainer.call(
                "POST",
                "/v1/steps",
                request(
                    run,
                    1,
                    "2",
                    self.out(run, "1", "2"),
                    url,
                    CONFIG,
                    uri=f"file://{s0}",
                ),
            )
            self.assertEqual(code, 202, st)
            st = trainer.wait(run, 1, timeout=300)
            self.assertEqual(st["state"], "done", st)
            code, again = trainer.call(
                "POST",
                "/v1/steps",
                request(
                    run,
                    1,
                    "3",
                    self.out(run, "1", "3"),
                    url,
                    CONFIG,
                    uri=f"file://{s0}",
                ),
            )
            self.assertEqual(
                (code, again["attempt"], again["result"]), (200, "2", st["result"])
            )  # done: answered, not retrained
            self.close_and_check_no_orphans(trainer)
        finally:
            trainer.close()
        held, disk = self.out(run, "1", "held"), self.out(run, "1", "2")
        files = sorted(os.listdir(held))
        self.assertEqual(files, sorted(os.listdir(disk)))
        for f in files:
            self.assertEqual(read(f"{held}/{f}"), read(f"{disk}/{f}"), f)
        ref = self.out(
            run, "ref1"
        )  # and one rank, from the same 2-rank shards, trains the same weights
        single_rank(ref, b1, uri=f"file://{s0}")
        self.assert_close_checkpoints(disk, ref)


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by torchrun) is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[1].split()[0] != "Z"
    except OSError:
        return False


if __name__ == "__main__":
    unittest.main()
