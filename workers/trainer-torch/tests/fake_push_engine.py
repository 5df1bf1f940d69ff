"""TEST FAKE: the weight-update side of an SGLang server, in its own process, for the push tests.

It plays one engine of rank `rank_offset` in the trainer's process group, as SGLang's
http_server.py and model_runner.py do: /init_weights_update_group joins the group
(init_custom_process_group; the call returns once everyone has joined),
/update_weights_from_distributed receives one broadcast per name, in order, into
tensors allocated from `dtypes` and `shapes` (getattr(torch, dtype)), and sets the
weight version when given; /update_weights_from_tensor unpickles the
MultiprocessingSerializer blob; /pause_generation, /flush_cache, /continue_generation
answer and are recorded. --api-key: 401 without `Authorization: Bearer`.
GET /received: the call order, the version, and every tensor received (as lists); POST /reset_received
forgets them. Each /init_weights_update_group builds a new group, so one engine serves many pushers.

    python3 fake_push_engine.py --port 0 [--api-key KEY]   # prints "listening PORT"
"""

import argparse
import base64
import json
import pickle
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
import torch.distributed as dist
import torch.multiprocessing  # noqa: F401  (registers the tensor reductions pickle needs)

state = {"calls": [], "version": "default", "tensors": {}, "group": None, "pg": None}


def init_custom_process_group(backend, init_method, world_size, rank, group_name):
    """As SGLang's python/sglang/srt/utils.py init_custom_process_group (its own copy, not the trainer's):
    a group that is not the default one, its rendezvous store under PrefixStore(group_name)."""
    import datetime

    import torch.distributed.distributed_c10d as c10d
    from torch.distributed.distributed_c10d import (
        Backend,
        PrefixStore,
        _new_process_group_helper,
        rendezvous,
    )

    timeout = datetime.timedelta(seconds=120)
    store, rank, world_size = next(
        rendezvous(init_method, rank, world_size, timeout=timeout)
    )
    store.set_timeout(timeout)
    store = PrefixStore(group_name, store)
    version = tuple(
        int(x) for x in torch.__version__.split("+")[0].split(".")[:2] if x.isdigit()
    )
    options = {"backend_options" if version >= (2, 6) else "pg_options": None}
    pg = _new_process_group_helper(
        world_size,
        rank,
        [],
        Backend(backend),
        store,
        group_name=group_name,
        timeout=timeout,
        **options,
    )
    pg = pg[0] if isinstance(pg, tuple) else pg
    ranks = (
        c10d._world.pg_group_ranks if hasattr(c10d, "_world") else c10d._pg_group_ranks
    )  # torch >= 2.0 | 1.13
    ranks[pg] = {i: i for i in range(world_size)}
    return pg


lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    api_key = None

    def log_message(self, fmt, *args):
        pass

    def _send(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self):
        n = int(self.headers.get("content-length") or 0)
        return json.loads(self.rfile.read(n) or b"{}")

    def do_GET(self):  # noqa: N802
        if self.path == "/received":
            with lock:
                return self._send(
                    200,
                    {
                        "calls": state["calls"],
                        "version": state["version"],
                        "tensors": {
                            k: {
                                "dtype": str(v.dtype),
                                "shape": list(v.shape),
                                "values": v.double().flatten().tolist(),
                            }
                            for k, v in state["tensors"].items()
                        },
                    },
                )
        if self.path == "/get_weight_version":
            return self._send(200, {"weight_version": state["version"]})
        self._send(404, {"detail": "Not Found"})

    def do_POST(self):  # noqa: N802
        if (
            Handler.api_key is not None
            and self.headers.get("authorization") != f"Bearer {Handler.api_key}"
        ):
            return self._send(401, {"error": "Unauthorized"})
        path = self.path
        b = self._body()
        with lock:
            state["calls"].append(path.lstrip("/"))
        if (
            path == "/reset_received"
        ):  # test control, not SGLang's: forget what was received (one engine serves many tests)
            with lock:
                state.update(calls=[], version="default", tensors={})
            return self._send(200, {})
        if path in ("/pause_generation", "/continue_generation", "/flush_cache"):
            return self._send(200, {})
        if path == "/init_weights_update_group":
            if (
                state["pg"] is not None
            ):  # a new pusher (torch allows a group name once): SGLang's destroy_weights_update_group
                dist.destroy_process_group(state["pg"])
            state["pg"] = init_custom_process_group(
                b["backend"],
                f"tcp://{b['master_address']}:{b['master_port']}",
                b["world_size"],
                b["rank_offset"],
                b["group_name"],
            )
            state["group"] = b["group_name"]
            return self._send(
                200,
                {
                    "success": True,
                    "message": "Succeeded to initialize custom process group.",
                },
            )
        if path == "/update_weights_from_distributed":
            if b.get("group_name") != state["group"]:
                return self._send(
                    400,
                    {
                        "success": False,
                        "message": f"unknown group {b.get('group_name')}",
                    },
                )
            for name, dtype, shape in zip(b["names"], b["dtypes"], b["shapes"]):
                t = torch.empty(shape, dtype=getattr(torch, dtype))
                dist.broadcast(t, src=0, group=state["pg"])
                with lock:
                    state["tensors"][name] = t
            if b.get("weight_version") is not None:
                state["version"] = b["weight_version"]
            return self._send(
                200,
                {"success": True, "message": "Succeeded to update parameter online."},
            )
        if path == "/update_weights_from_tensor":
            blobs = b["serialized_named_tensors"]
            named = pickle.loads(base64.b64decode(blobs[0]))
            with lock:
                for name, t in named:
                    state["tensors"][name] = t.clone()
            if b.get("weight_version") is not None:
                state["version"] = b["weight_version"]
            return self._send(
                200, {"success": True, "message": "Succeeded to update model weights."}
            )
        self._send(404, {"detail": "Not Found"})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--api-key", default=None)
    args = ap.parse_args()
    Handler.api_key = args.api_key
    httpd = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    httpd.daemon_threads = True
    sys.stdout.write(f"listening {httpd.server_address[1]}\n")
    sys.stdout.flush()
    httpd.serve_forever()


if __name__ == "__main__":
    main()
