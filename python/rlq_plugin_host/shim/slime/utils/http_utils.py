"""slime's `post` / `get` (slime/utils/http_utils.py) for plugins run by rlq's host.

Inside a custom generate function that rlq calls, a POST to a `/generate`
URL is answered by rlq's own engine call (the sample's request id, seed,
weight version, abort and staleness bound stay rlq's); the answer has
SGLang's /generate shape (`text`, `meta_info.finish_reason.type`,
`meta_info.output_token_logprobs` as [logprob, token_id, None]). Any other
URL is a plain HTTP request.
"""

import asyncio
import contextvars
import json
import urllib.request
from urllib.parse import urlparse

# Set by the host for the duration of one generate call: an async fn(payload) -> dict.
engine_bridge: contextvars.ContextVar = contextvars.ContextVar(
    "rlq_engine_bridge", default=None
)


def _http(method: str, url: str, payload, headers) -> dict:
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(
        url,
        data=data,
        method=method,
        headers={"content-type": "application/json", **(headers or {})},
    )
    with urllib.request.urlopen(req, timeout=600) as resp:
        return json.loads(resp.read().decode() or "null")


async def post(
    url: str,
    payload: dict,
    max_retries: int = 60,
    headers: dict | None = None,
    **kwargs,
):
    bridge = engine_bridge.get()
    if bridge is not None and urlparse(url).path.rstrip("/").endswith("/generate"):
        return await bridge(payload)
    return await asyncio.to_thread(_http, "POST", url, payload, headers)


async def get(url: str, headers: dict | None = None, **kwargs):
    return await asyncio.to_thread(_http, "GET", url, None, headers)
