"""trainer_push into vLLM (rlq_torch/weight_push.py VllmPusher).

gloo (rlq_torch/vllm_gloo.py), end to end: a real vLLM CPU server started through rlq_torch.vllm_serve
with --weight-transfer-config '{"backend": "gloo"}' takes the fixture model's weights, perturbed, as
version 5 through vLLM's own routes (pause, start, update while the trainer broadcasts, finish with
the version, resume); /weight_info then reads "5", and the server's prompt log-probs equal those it
computes after loading the same perturbed weights from disk (reload_weights), so every tensor landed
where its name says.

nccl: the orchestration is the same; on a machine without CUDA the pusher refuses before any call,
naming the gloo way; with CUDA it goes past that gate to the engine's /get_world_size (here an
address nothing listens on, so the call itself fails by name). The transfer end to end needs vLLM's
CUDA build and a GPU server, which this project's machines do not have.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request
from types import SimpleNamespace

from helpers import ROOT, require

require("torch", "safetensors", "vllm")

import torch
from rlq_torch.weight_push import (
    VLLM_CPU_REFUSAL,
    PushError,
    VllmPusher,
    pusher_from_args,
)
from safetensors.torch import load_file, save_file

REPO = os.path.dirname(os.path.dirname(ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(method: str, url: str, body=None, timeout_s: float = 300):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url, data=data, method=method, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as res:
        return json.loads(res.read().decode() or "{}")


def fixture_model() -> str:
    out = subprocess.run(
        [sys.executable, os.path.join(REPO, "scripts/build-fixture-model.py")],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip().splitlines()[-1]


class VllmGlooServer:
    """vLLM's OpenAI server on the CPU with the gloo weight transfer backend, as scripts/real-stack.ts
    startVllm starts it (dev mode, 1 GiB of KV cache, float32)."""

    def __init__(self, model: str, *extra: str, port: int | None = None) -> None:
        self.port = port or free_port()
        self.model = model
        self.extra = extra
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [ROOT]
                + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
            ),
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
        }
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rlq_torch.vllm_serve",
                "--model",
                model,
                "--served-model-name",
                "fixture",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--dtype",
                "float32",
                "--max-model-len",
                "128",
                "--seed",
                "0",
                *extra,
            ],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 600
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"vLLM exited ({self.proc.returncode}) before it was healthy:\n{self.tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass  # not listening yet
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError(
                    f"vLLM did not answer /health in 600 s:\n{self.tail()}"
                )
            time.sleep(1)

    def tail(self, n: int = 6000) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-n:]

    def prompt_logprobs(self, ids: list[int]) -> list[float]:
        """vLLM's log-prob of each prompt token after the first, given those before it."""
        out = call(
            "POST",
            f"{self.url}/v1/completions",
            {
                "model": "fixture",
                "prompt": ids,
                "max_tokens": 1,
                "temperature": 0,
                "prompt_logprobs": 0,
            },
        )
        entries = out["choices"][0]["prompt_logprobs"][1:]
        return [float(e[str(t)]["logprob"]) for e, t in zip(entries, ids[1:])]

    def restart(self) -> "VllmGlooServer":
        """SIGKILL the whole server (API server and engine core, as a crash would) and start a new one
        on the same port."""
        os.killpg(self.proc.pid, 9)
        self.proc.wait()
        self.log.close()
        return VllmGlooServer(self.model, *self.extra, port=self.port)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        self.log.close()


def perturbed_weights(model: str, seed: int) -> list[tuple[str, torch.Tensor]]:
    """The fixture model's weights, each moved by 5% of its spread: a version vLLM can tell apart."""
    weights = load_file(os.path.join(model, "weights.safetensors"))
    gen = torch.Generator().manual_seed(seed)
    return sorted(
        (n, (t + 0.05 * t.std() * torch.randn(t.shape, generator=gen)).contiguous())
        for n, t in weights.items()
    )


class VllmGlooPushTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.model = fixture_model()
        cls.server = VllmGlooServer(
            cls.model, "--weight-transfer-config", '{"backend": "gloo"}'
        )

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.close()

    def test_a_push_lands_every_tensor_under_its_version(self) -> None:
        server = self.server
        ids = [2, 40, 51, 60, 77, 90, 101, 120, 150, 200, 250, 14]
        before = server.prompt_logprobs(ids)
        self.assertEqual(
            call("GET", f"{server.url}/weight_info")["weight_version"], "default"
        )

        perturbed = dict(perturbed_weights(self.model, 0))
        pusher = VllmPusher(
            [server.url],
            backend="gloo",
            master_address="127.0.0.1",
            master_port=free_port(),
            timeout_s=300,
        )
        try:
            out = pusher.push(sorted(perturbed.items()), 5)
        except PushError as e:
            raise AssertionError(f"{e}\n--- vLLM ---\n{server.tail()}") from e
        finally:
            pusher.close()
        self.assertEqual(out["via"], "vllm-gloo")
        self.assertEqual(out["tensors"], len(perturbed))
        self.assertEqual(
            call("GET", f"{server.url}/weight_info")["weight_version"], "5"
        )
        pushed = server.prompt_logprobs(ids)
        self.assertGreater(
            max(abs(a - b) for a, b in zip(pushed, before)),
            1e-3,
            "the push changed nothing vLLM computes",
        )

        # The same weights from disk, on the same server: what the push must have produced.
        with tempfile.TemporaryDirectory() as d:
            for f in os.listdir(self.model):
                if f != "weights.safetensors":
                    shutil.copy(os.path.join(self.model, f), d)
            save_file(perturbed, os.path.join(d, "weights.safetensors"))
            call("POST", f"{server.url}/pause?mode=wait", {})
            try:
                call(
                    "POST",
                    f"{server.url}/collective_rpc",
                    {"method": "reload_weights", "kwargs": {"weights_path": d}},
                )
            finally:
                call("POST", f"{server.url}/resume", {})
        loaded = server.prompt_logprobs(ids)
        diff = max(abs(a - b) for a, b in zip(pushed, loaded))
        self.assertLess(diff, 1e-5, f"pushed {pushed}\nloaded {loaded}")

    def pusher(self, urls: list[str], master_port: int | None = None) -> VllmPusher:
        return VllmPusher(
            urls,
            backend="gloo",
            master_address="127.0.0.1",
            master_port=master_port or free_port(),
            timeout_s=300,
        )

    def version(self) -> str:
        return call("GET", f"{self.server.url}/weight_info")["weight_version"]

    def test_b_an_engine_down_keeps_no_other_from_the_version(self) -> None:
        down = f"http://127.0.0.1:{closed_port()}"
        pusher = self.pusher([down, self.server.url])
        try:
            with self.assertRaises(PushError) as caught:
                pusher.push(perturbed_weights(self.model, 1), 6)
        finally:
            pusher.close()
        message = str(caught.exception)
        self.assertIn(f"version 6 reached ['{self.server.url}']", message)
        self.assertIn(f"not {down}: GET {down}/get_world_size", message)
        self.assertEqual(self.version(), "6")

    def test_c_a_session_a_killed_trainer_left_open_is_closed(self) -> None:
        # A trainer killed between /start_weight_update and /finish_weight_update leaves the session
        # open; vLLM refuses the next start until it is finished.
        call("POST", f"{self.server.url}/start_weight_update", {})
        pusher = self.pusher([self.server.url])
        try:
            out = pusher.push(perturbed_weights(self.model, 2), 7)
        except PushError as e:
            raise AssertionError(f"{e}\n--- vLLM ---\n{self.server.tail()}") from e
        finally:
            pusher.close()
        self.assertEqual((out["engines"], self.version()), ([self.server.url], "7"))

    def test_d_a_restarted_server_and_a_restarted_trainer_join_again(self) -> None:
        ids = [2, 40, 51, 60, 77, 90, 101, 120, 150, 200, 250, 14]
        port = free_port()
        first = self.pusher([self.server.url], port)
        try:
            first.push(perturbed_weights(self.model, 3), 8)
            self.assertEqual(self.version(), "8")
            # The server dies and comes back at its launch weights, without the trainer's group.
            type(self).server = self.server.restart()
            self.assertEqual(self.version(), "default")
            # The same trainer, on its same store port: it sees the engine lost version 8 and joins it again.
            weights = perturbed_weights(self.model, 4)
            first.push(weights, 9)
            self.assertEqual(self.version(), "9")
            after_rejoin = self.server.prompt_logprobs(ids)
        except PushError as e:
            raise AssertionError(f"{e}\n--- vLLM ---\n{self.server.tail()}") from e
        finally:
            first.close()
        # A trainer restarted (a new process's pusher) against a server that still holds its
        # predecessor's group: its own trainer_init replaces it.
        second = self.pusher([self.server.url], port)
        try:
            second.push(weights, 10)
        except PushError as e:
            raise AssertionError(f"{e}\n--- vLLM ---\n{self.server.tail()}") from e
        finally:
            second.close()
        self.assertEqual(self.version(), "10")
        # The same weights pushed twice: what vLLM computes is the same, so version 9 had landed whole.
        again = self.server.prompt_logprobs(ids)
        self.assertLess(max(abs(a - b) for a, b in zip(after_rejoin, again)), 1e-6)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmPushGateTest(unittest.TestCase):
    def test_the_nccl_gate(self) -> None:
        url = f"http://127.0.0.1:{closed_port()}"
        pusher = VllmPusher(
            [url],
            backend="nccl",
            master_address="127.0.0.1",
            master_port=closed_port(),
            api_key="k",
        )
        with self.assertRaises(PushError) as caught:
            pusher.push([("w", torch.ones(2, 2))], 3)
        if torch.cuda.is_available():
            self.assertIn(f"GET {url}/get_world_size", str(caught.exception))
        else:
            self.assertEqual(str(caught.exception), VLLM_CPU_REFUSAL)
            self.assertIn("--push-via vllm-gloo", VLLM_CPU_REFUSAL)
            self.assertIn('{"backend": "gloo"}', VLLM_CPU_REFUSAL)
            self.assertIn("weight_sync: disk", VLLM_CPU_REFUSAL)

    def test_the_server_flags_pick_the_backend(self) -> None:
        for via, backend in (("vllm-nccl", "nccl"), ("vllm-gloo", "gloo")):
            args = SimpleNamespace(
                push_engines="http://127.0.0.1:1,http://127.0.0.1:2",
                push_via=via,
                push_master_address="127.0.0.1",
                push_master_port=29700,
            )
            pusher = pusher_from_args(args, "k")
            self.assertIsInstance(pusher, VllmPusher)
            self.assertEqual(pusher.backend, backend)
            self.assertEqual(
                [c.url for c in pusher.clients],
                ["http://127.0.0.1:1", "http://127.0.0.1:2"],
            )

    def test_no_engine_and_an_unknown_backend(self) -> None:
        with self.assertRaises(PushError):
            VllmPusher([], backend="gloo", master_address="127.0.0.1", master_port=1)
        with self.assertRaisesRegex(
            PushError, r"'ipc': rlq pushes with \['gloo', 'nccl'\]"
        ):
            VllmPusher(
                ["http://127.0.0.1:1"],
                backend="ipc",
                master_address="127.0.0.1",
                master_port=1,
            )


if __name__ == "__main__":
    unittest.main()
