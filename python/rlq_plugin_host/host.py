"""rlq's Python plugin host: runs a slime user's plugin functions unmodified.

rlq (src/plugins/python.ts) starts one host per worker process and talks to it
in JSON lines over stdin/stdout. Standard library only.

Request:  {"id": 1, "op": "call", "kind": "reward", "target": "<target>", "args": {<run config>}, ...}
Answer:   {"id": 1, "ok": true, "result": ...}
          {"id": 1, "ok": false, "error": {"kind": "threw" | "bad_return" | "load", "type": ..., "message": ..., "traceback": ...}}

A target is `pkg.module.fn` (imported as slime's load_function does:
slime/utils/misc.py, importlib on the module, getattr the last part) or
`/abs/path/file.py:fn` (the file's directory goes on sys.path first).

The signatures are slime's:
- reward:         [async] fn(args, sample: Sample) -> number | dict        (slime/rollout/rm_hub/__init__.py async_rm)
- reward_group:   [async] fn(args, samples: list[Sample]) -> list           (rm_hub batched_async_rm, --group-rm)
- dynamic_filter: fn(args, samples: list[Sample]) -> bool | DynamicFilterOutput
                  (slime/rollout/filter_hub/base_types.py call_dynamic_filter)
- buffer_filter:  fn(args, rollout_id, buffer: list[list[Sample]], num_samples) -> list[list[Sample]]
                  (slime/rollout/data_source.py pop_first)
- generate:       async fn(args, sample, sampling_params[, evaluation]) -> Sample
                  (slime/rollout/sglang_rollout.py generate_and_rm); its `post` to /generate
                  (slime.utils.http_utils) is sent to rlq as {"id", "engine": n, "payload"} and
                  answered with {"engine_reply": n, "ok", "result"} on stdin. The request's
                  "images" (file paths) become sample.multimodal_inputs["images"]; the answer's
                  "images" are the ones the function added there, as image_data entries.
`args` is an argparse.Namespace of the run's config under slime's names.
"""

import argparse
import asyncio
import base64
import importlib
import importlib.util
import inspect
import json
import math
import os
import sys
import threading
import traceback

SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shim")
if SHIM not in sys.path:
    sys.path.append(SHIM)  # last: an installed slime wins
# `pkg.module.fn` targets import from the directory rlq starts the host in, as slime's from its cwd.
if os.getcwd() not in sys.path:
    sys.path.insert(1, os.getcwd())

from slime.utils import http_utils  # noqa: E402
from slime.utils.types import Sample  # noqa: E402


class BadReturn(Exception):
    pass


_functions: dict = {}


def load_target(target: str):
    hit = _functions.get(target)
    if hit is not None:
        return hit
    if ":" in target and target.rsplit(":", 1)[0].endswith(".py"):
        file, attr = target.rsplit(":", 1)
        directory = os.path.dirname(os.path.abspath(file))
        if directory not in sys.path:
            sys.path.insert(0, directory)
        name = os.path.splitext(os.path.basename(file))[0]
        spec = importlib.util.spec_from_file_location(name, file)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {file}")
        module = sys.modules.get(name)
        if module is None or getattr(module, "__file__", None) != os.path.abspath(file):
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
    else:
        module_name, _, attr = target.rpartition(".")
        if not module_name:
            raise ImportError(f"'{target}' is not module.function")
        module = importlib.import_module(module_name)
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ImportError(f"{module.__name__} has no function '{attr}'")
    _functions[target] = fn
    return fn


def to_sample(d: dict, **extra) -> Sample:
    """rlq's sample record (docs/plugins.md) as slime's Sample."""
    s = Sample(
        group_index=d.get("groupId"),
        index=d.get("sampleIndex"),
        prompt=d.get("prompt", ""),
        response=d.get("response", ""),
        label=d.get("label"),
        metadata=dict(d.get("metadata") or {}),
        status=Sample.Status(d.get("status", "pending")),
        tokens=list(d.get("tokens") or []),
        response_length=int(d.get("responseLength") or 0),
    )
    for k, v in extra.items():
        setattr(s, k, v)
    return s


def plain(value, path="the value"):
    """JSON-able copy of a plugin's return, or BadReturn naming what could not be sent."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise BadReturn(f"{path} is {value!r}, not a finite number")
        return value
    if (
        hasattr(value, "item")
        and callable(value.item)
        and getattr(value, "ndim", 0) == 0
    ):
        return plain(
            value.item(), path
        )  # a torch / numpy scalar, as slime's own filters return
    if isinstance(value, dict):
        return {str(k): plain(v, f"{path}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, f"{path}[{i}]") for i, v in enumerate(value)]
    raise BadReturn(f"{path} is a {type(value).__name__} ({_short(value)})")


def _short(value) -> str:
    r = repr(value)
    return r if len(r) <= 200 else r[:200] + "..."


def reward_value(value, path="the value"):
    # slime's rm_hub returns ints and bools freely; rlq's rewards are numbers.
    if isinstance(value, bool):
        return int(value)
    return plain(value, path)


def slime_sampling_params(args) -> dict:
    """The sampling params slime's GenerateState builds from args (slime/rollout/sglang_rollout.py)."""
    return {
        "temperature": getattr(args, "rollout_temperature", 1.0),
        "top_p": getattr(args, "rollout_top_p", 1.0),
        "top_k": getattr(args, "rollout_top_k", -1),
        "max_new_tokens": getattr(args, "rollout_max_response_len", None),
        "stop": getattr(args, "rollout_stop", None),
        "stop_token_ids": getattr(args, "rollout_stop_token_ids", None),
        "skip_special_tokens": getattr(args, "rollout_skip_special_tokens", False),
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }


def open_images(paths: list) -> list:
    """The sample's images as slime's functions read sample.multimodal_inputs["images"]: PIL images
    in RGB (qwen_vl_utils' fetch_image, through slime's process_vision_info), or their file paths
    when Pillow is not installed in this Python."""
    try:
        from PIL import Image
    except ImportError:
        return list(paths)
    out = []
    for p in paths:
        with Image.open(p) as img:
            out.append(img.convert("RGB"))
    return out


def image_entry(image, path: str) -> str:
    """One image a function added to sample.multimodal_inputs["images"], as an image_data entry
    (base64 PNG for a PIL image, as slime's encode_image_for_rollout_engine writes it; a file's
    bytes as base64, whatever its name; a data URI or base64 string as it is)."""
    if isinstance(image, str):
        if os.path.isfile(image):
            with open(image, "rb") as f:
                return base64.b64encode(f.read()).decode("ascii")
        return image
    if isinstance(image, (bytes, bytearray)):
        return base64.b64encode(bytes(image)).decode("ascii")
    if hasattr(image, "save"):
        from slime.utils.processing_utils import encode_image_for_rollout_engine

        return encode_image_for_rollout_engine(image)
    raise BadReturn(
        f"{path} is a {type(image).__name__} ({_short(image)}); expected a PIL image, a path, a data URI or base64"
    )


def added_images(out, handed: int) -> list:
    mm = getattr(out, "multimodal_inputs", None)
    images = mm.get("images") if isinstance(mm, dict) else None
    if not images:
        return []
    return [
        image_entry(img, f'sample.multimodal_inputs["images"][{i}]')
        for i, img in enumerate(images)
        if i >= handed
    ]


async def run_generate(fn, args, req: dict, bridge):
    s = req["sample"]
    prompt_tokens = list(s.get("promptTokens") or [])
    response_tokens = list(s.get("responseTokens") or [])
    sample = to_sample(
        {
            **s,
            "tokens": prompt_tokens + response_tokens,
            "responseLength": len(response_tokens),
        },
    )
    # slime's generate expects PENDING, or ABORTED for a sample continued after an abort (partial rollout).
    sample.status = Sample.Status.ABORTED if response_tokens else Sample.Status.PENDING
    handed = list(req.get("images") or [])
    if handed:
        sample.multimodal_inputs = {"images": open_images(handed)}
    params = slime_sampling_params(args)
    token = http_utils.engine_bridge.set(bridge)
    try:
        if "evaluation" in inspect.signature(fn).parameters:
            out = fn(args, sample, params, evaluation=False)
        else:
            out = fn(args, sample, params)
        if inspect.isawaitable(out):
            out = await out
    finally:
        http_utils.engine_bridge.reset(token)
    if not isinstance(out, Sample) and not hasattr(out, "tokens"):
        raise BadReturn(
            f"the value is a {type(out).__name__} ({_short(out)}), not the Sample"
        )
    status = out.status.value if hasattr(out.status, "value") else str(out.status)
    return {
        "tokens": plain(list(out.tokens), "sample.tokens"),
        "response_length": int(out.response_length or 0),
        "loss_mask": plain(out.loss_mask, "sample.loss_mask"),
        "status": status,
        "images": added_images(out, len(handed)),
    }


async def run_call(req: dict, bridge=None):
    fn = load_target(req["target"])
    args = argparse.Namespace(**req.get("args", {}))
    # slime's generate functions build their /generate URL from these; rlq answers that URL itself.
    for name, default in (
        ("sglang_router_ip", "rlq-engine"),
        ("sglang_router_port", 0),
    ):
        if getattr(args, name, None) is None:
            setattr(args, name, default)
    kind = req["kind"]
    if kind == "reward":
        out = fn(args, to_sample(req["sample"]))
        if inspect.isawaitable(out):
            out = await out
        return reward_value(out)
    if kind == "reward_group":
        out = fn(args, [to_sample(s) for s in req["samples"]])
        if inspect.isawaitable(out):
            out = await out
        if not isinstance(out, (list, tuple)):
            raise BadReturn(f"the value is a {type(out).__name__} ({_short(out)})")
        return [reward_value(v, f"[{i}]") for i, v in enumerate(out)]
    if kind == "dynamic_filter":
        group = req["group"]
        key = getattr(args, "reward_key", None)
        samples = [
            to_sample(
                {**s, "groupId": group["groupId"], "sampleIndex": i},
                reward={key: r} if key else r,
            )
            for i, (s, r) in enumerate(
                zip(group["samples"], group["rewards"], strict=True)
            )
        ]
        out = fn(args, samples)
        if inspect.isawaitable(out):
            out = await out
        if hasattr(out, "keep") and not isinstance(out, dict):
            keep = out.keep
            keep = keep.item() if hasattr(keep, "item") else keep
            if not isinstance(keep, bool):
                raise BadReturn(f"keep is a {type(keep).__name__} ({_short(keep)})")
            return {
                "keep": keep,
                "reason": getattr(out, "reason", None),
                "keep_when_insufficient": bool(
                    getattr(out, "keep_when_insufficient", False)
                ),
            }
        if hasattr(out, "item") and getattr(out, "ndim", 0) == 0:
            out = out.item()
        return plain(out)
    if kind == "buffer_filter":
        # rlq's buffer holds group ids; each group is one Sample carrying its group_index.
        buffer = [[Sample(group_index=int(g["groupId"]))] for g in req["buffer"]]
        out = fn(args, req.get("rollout_id"), buffer, req["n"])
        if inspect.isawaitable(out):
            out = await out
        if not isinstance(out, (list, tuple)):
            raise BadReturn(f"the value is a {type(out).__name__} ({_short(out)})")
        ids = []
        for i, group in enumerate(out):
            first = group[0] if isinstance(group, (list, tuple)) and group else group
            if not isinstance(first, Sample) and not hasattr(first, "group_index"):
                raise BadReturn(
                    f"[{i}] is a {type(group).__name__} ({_short(group)}), not a group of Samples"
                )
            ids.append(str(first.group_index))
        return ids
    if kind == "generate":
        return await run_generate(fn, args, req, bridge)
    raise ValueError(f"unknown kind {kind!r}")


def error(kind: str, e: BaseException) -> dict:
    # The user's frames only: the host's own are the same for every call.
    frames = [
        f
        for f in traceback.extract_tb(e.__traceback__)
        if os.path.abspath(f.filename) != os.path.abspath(__file__)
    ]
    tb = "".join(traceback.format_list(frames))
    return {
        "kind": kind,
        "type": type(e).__name__,
        "message": str(e),
        "traceback": tb[-4000:],
    }


class Host:
    def __init__(self, out):
        self.out = out
        self.lock = threading.Lock()
        self.next_engine_id = 1
        self.engine_waiting: dict = {}

    def bridge_for(self, call_id):
        async def bridge(payload: dict) -> dict:
            eid = self.next_engine_id
            self.next_engine_id += 1
            fut = asyncio.get_running_loop().create_future()
            self.engine_waiting[eid] = fut
            self.send(
                {"id": call_id, "engine": eid, "payload": plain(payload, "payload")}
            )
            reply = await fut
            if not reply.get("ok"):
                raise RuntimeError(f"rlq's engine call failed: {reply.get('error')}")
            return reply["result"]

        return bridge

    def on_engine_reply(self, msg: dict) -> None:
        fut = self.engine_waiting.pop(msg["engine_reply"], None)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    def send(self, obj: dict) -> None:
        line = json.dumps(obj, allow_nan=False)
        with self.lock:
            self.out.write(line + "\n")
            self.out.flush()

    async def handle(self, req: dict) -> None:
        rid = req.get("id")
        try:
            if req.get("op") == "load":
                load_target(req["target"])
                self.send({"id": rid, "ok": True, "result": None})
                return
            result = await run_call(req, self.bridge_for(rid))
            self.send({"id": rid, "ok": True, "result": result})
        except BadReturn as e:
            self.send(
                {
                    "id": rid,
                    "ok": False,
                    "error": {
                        "kind": "bad_return",
                        "type": "BadReturn",
                        "message": str(e),
                        "traceback": "",
                    },
                }
            )
        except (ImportError, SyntaxError) as e:
            # An import that fails inside the user's module is its error, as in slime's load_function.
            self.send(
                {
                    "id": rid,
                    "ok": False,
                    "error": error("load" if req.get("op") == "load" else "threw", e),
                }
            )
        except Exception as e:
            self.send({"id": rid, "ok": False, "error": error("threw", e)})


def main() -> None:
    # The protocol owns the real stdout; a plugin's print() goes to stderr.
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    host = Host(out)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    tasks: set = set()
    done = loop.create_future()

    def on_line(line: str) -> None:
        req = json.loads(line)
        if "engine_reply" in req:
            host.on_engine_reply(req)
            return
        task = loop.create_task(host.handle(req))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def reader() -> None:
        for line in sys.stdin:
            if line.strip():
                loop.call_soon_threadsafe(on_line, line)
        # rlq closed our stdin (it exited or was killed): finish what is running, then exit.
        loop.call_soon_threadsafe(lambda: done.done() or done.set_result(None))

    threading.Thread(target=reader, daemon=True).start()
    host.send({"ready": True, "pid": os.getpid(), "python": sys.version.split()[0]})

    async def until_done() -> None:
        await done
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    loop.run_until_complete(until_done())


if __name__ == "__main__":
    main()
