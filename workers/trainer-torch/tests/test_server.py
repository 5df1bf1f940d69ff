"""The HTTP protocol (docs/trainer-protocol.md), against a real server process on an ephemeral port."""

import os
import shutil
import tempfile
import time
import unittest

from helpers import BatchServer, TrainerProcess, make_batch, request, require

require("torch")


class ProtocolTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.batches = BatchServer()
        cls.trainer = TrainerProcess()
        cls.tmp = tempfile.mkdtemp(prefix="rlq-trainer-test-")

    @classmethod
    def tearDownClass(cls):
        cls.trainer.close()
        cls.batches.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def out(self, run, step, attempt):
        d = os.path.join(self.tmp, run, f"step-{step}", f"attempt-{attempt}")
        os.makedirs(d, exist_ok=True)
        return d

    def test_health(self):
        code, h = self.trainer.call("GET", "/v1/health")
        self.assertEqual(code, 200)
        self.assertEqual((h["ok"], h["device"]), (True, "cpu"))
        self.assertIn("busy", h)
        self.assertIn("weight_version", h)

    def test_a_step_trains_once_and_answers_idempotently(self):
        run = "idem"
        url = self.batches.add(f"{run}-0", make_batch(run, 0, seed=1))
        code, st = self.trainer.call(
            "POST", "/v1/steps", request(run, 0, "1", self.out(run, 0, "1"), url)
        )
        self.assertEqual(code, 202)
        self.assertEqual((st["state"], st["attempt"]), ("running", "1"))
        done = self.trainer.wait(run, 0)
        self.assertEqual(done["state"], "done", done)
        res = done["result"]
        self.assertEqual(res["weight_version_out"], 1)
        self.assertEqual(res["checkpoint_uri"], "file://" + self.out(run, 0, "1"))
        self.assertEqual(res["num_samples"], 16)
        self.assertGreater(done["progress_seq"], 3)
        self.assertEqual(
            sorted(os.listdir(self.out(run, 0, "1"))),
            ["optimizer.safetensors", "weights.safetensors"],
        )
        for attempt in (
            "1",
            "2",
        ):  # same attempt, then a new one: the finished result either way
            code, again = self.trainer.call(
                "POST",
                "/v1/steps",
                request(run, 0, attempt, self.out(run, 0, attempt), url),
            )
            self.assertEqual(code, 200)
            self.assertEqual(
                (again["state"], again["attempt"], again["result"]), ("done", "1", res)
            )
        self.assertEqual(self.batches.hits[f"{run}-0"], 1)  # trained (and fetched) once
        self.assertEqual(os.listdir(self.out(run, 0, "2")), [])

        # The next step continues from that checkpoint (version handshake), held in memory.
        url1 = self.batches.add(f"{run}-1", make_batch(run, 1, seed=2))
        code, _ = self.trainer.call(
            "POST",
            "/v1/steps",
            request(
                run, 1, "1", self.out(run, 1, "1"), url1, uri=res["checkpoint_uri"]
            ),
        )
        self.assertEqual(code, 202)
        st1 = self.trainer.wait(run, 1)
        self.assertEqual(
            (st1["state"], st1["result"]["weight_version_out"]), ("done", 2), st1
        )
        _, h = self.trainer.call("GET", "/v1/health")
        self.assertEqual((h["weight_version"], h["busy"]), (2, False))

    def test_a_new_attempt_supersedes_a_running_one(self):
        run = "super"
        slow = self.batches.add(f"{run}-slow", make_batch(run, 0, seed=3), delay=1.5)
        fast = self.batches.add(f"{run}-fast", make_batch(run, 0, seed=3))
        self.assertEqual(
            self.trainer.call(
                "POST", "/v1/steps", request(run, 0, "1", self.out(run, 0, "1"), slow)
            )[0],
            202,
        )
        time.sleep(0.3)
        code, st = self.trainer.call(
            "POST", "/v1/steps", request(run, 0, "2", self.out(run, 0, "2"), fast)
        )
        self.assertEqual((code, st["attempt"], st["state"]), (202, "2", "running"))
        done = self.trainer.wait(run, 0)
        self.assertEqual((done["state"], done["attempt"]), ("done", "2"))
        self.assertEqual(
            done["result"]["checkpoint_uri"], "file://" + self.out(run, 0, "2")
        )
        # One worker thread runs the steps: attempt 2 ran only after the superseded attempt 1 had stopped
        # (at its next safe point), so what attempt 1 wrote is already on disk: nothing.
        self.assertEqual(os.listdir(self.out(run, 0, "1")), [])

    def test_cancel(self):
        run = "cancel"
        slow = self.batches.add(f"{run}-slow", make_batch(run, 0, seed=4), delay=1.0)
        self.trainer.call(
            "POST", "/v1/steps", request(run, 0, "1", self.out(run, 0, "1"), slow)
        )
        code, st = self.trainer.call(
            "POST", f"/v1/steps/{run}/0/cancel", {"attempt": "9"}
        )  # another attempt: no effect
        self.assertEqual((code, st["state"]), (200, "running"))
        seq = st["progress_seq"]
        code, st = self.trainer.call(
            "POST", f"/v1/steps/{run}/0/cancel", {"attempt": "1"}
        )
        self.assertEqual((code, st["state"]), (200, "cancelled"))
        self.assertGreater(st["progress_seq"], seq)
        self.wait_idle()  # the worker let go of the cancelled attempt (after its slow batch arrived)
        _, st = self.trainer.call("GET", f"/v1/steps/{run}/0")
        self.assertEqual(st["state"], "cancelled")
        self.assertEqual(os.listdir(self.out(run, 0, "1")), [])
        # A new attempt after a cancel trains.
        fast = self.batches.add(f"{run}-fast", make_batch(run, 0, seed=4))
        self.assertEqual(
            self.trainer.call(
                "POST", "/v1/steps", request(run, 0, "2", self.out(run, 0, "2"), fast)
            )[0],
            202,
        )
        self.assertEqual(self.trainer.wait(run, 0)["state"], "done")

    def wait_idle(self, timeout: float = 60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            _, h = self.trainer.call("GET", "/v1/health")
            if not h["busy"]:
                return
            time.sleep(0.05)
        self.fail("the trainer stayed busy")

    def test_not_found(self):
        code, body = self.trainer.call("GET", "/v1/steps/nope/3")
        self.assertEqual(
            (code, body["error"]["code"], body["error"]["retryable"]),
            (404, "not_found", False),
        )
        code, body = self.trainer.call(
            "POST", "/v1/steps/nope/3/cancel", {"attempt": "1"}
        )
        self.assertEqual((code, body["error"]["code"]), (404, "not_found"))

    def test_bad_requests(self):
        url = self.batches.add("bad", make_batch("bad", 0))
        good = request("bad", 0, "1", self.out("bad", 0, "1"), url)
        cases = {
            "missing run_id": {k: v for k, v in good.items() if k != "run_id"},
            "attempt not a string": {**good, "attempt": 1},
            "relative output_dir": {**good, "output_dir": "step-0"},
            "null checkpoint above version 0": {
                **good,
                "step": 3,
                "weight_version_in": 3,
            },
            "unknown estimator": {
                **good,
                "config": {**good["config"], "advantage_estimator": "magic"},
            },
            "slime's cross-field rule": {
                **good,
                "config": {**good["config"], "kl_coef": 0.1, "kl_loss_coef": 0.1},
            },
            "ppo: num_critic_only_steps not an integer": {
                **good,
                "config": {
                    **good["config"],
                    "advantage_estimator": "ppo",
                    "num_critic_only_steps": 1.5,
                },
            },
            "negative lr": {**good, "config": {**good["config"], "lr": -1}},
        }
        for name, body in cases.items():
            with self.subTest(name):
                code, r = self.trainer.call("POST", "/v1/steps", body)
                self.assertEqual(
                    (code, r["error"]["code"], r["error"]["retryable"]),
                    (400, "bad_request", False),
                    r,
                )
        code, r = self.trainer.call(
            "POST",
            "/v1/steps",
            {
                **good,
                "step": 1,
                "weight_version_in": 1,
                "checkpoint_uri_in": "file:///nonexistent/step-0/attempt-0",
            },
        )
        self.assertEqual(
            (code, r["error"]["code"], r["error"]["retryable"]),
            (409, "version_unavailable", True),
        )

    def test_batch_fetch_failures_are_retryable(self):
        for name, url in {
            "http error": self.batches.add("missing", b"", status=404),
            "not RLQB": self.batches.add("garbage", b"hello world, not a batch"),
            "unreachable": "http://127.0.0.1:9/batch",
        }.items():
            with self.subTest(name):
                run = f"fetch{abs(hash(name)) % 1000}"
                self.assertEqual(
                    self.trainer.call(
                        "POST",
                        "/v1/steps",
                        request(run, 0, "1", self.out(run, 0, "1"), url),
                    )[0],
                    202,
                )
                st = self.trainer.wait(run, 0)
                self.assertEqual(
                    (st["state"], st["error"]["code"], st["error"]["retryable"]),
                    ("failed", "batch_fetch_failed", True),
                    st,
                )
                # A failed attempt is not retrained when asked again; a new attempt is.
                code, again = self.trainer.call(
                    "POST",
                    "/v1/steps",
                    request(run, 0, "1", self.out(run, 0, "1"), url),
                )
                self.assertEqual((code, again["state"]), (200, "failed"))

    def test_a_version_mismatch_fails_the_step(self):
        run = "vm"
        url = self.batches.add(f"{run}-0", make_batch(run, 0, seed=6))
        self.trainer.call(
            "POST", "/v1/steps", request(run, 0, "1", self.out(run, 0, "1"), url)
        )
        uri = self.trainer.wait(run, 0)["result"]["checkpoint_uri"]
        url1 = self.batches.add(f"{run}-1", make_batch(run, 1, seed=6))
        self.trainer.call(
            "POST",
            "/v1/steps",
            request(run, 1, "1", self.out(run, 1, "1"), url1, uri=uri, v_in=5),
        )
        st = self.trainer.wait(run, 1)
        self.assertEqual(
            (st["state"], st["error"]["code"]), ("failed", "bad_request"), st
        )


if __name__ == "__main__":
    unittest.main()
