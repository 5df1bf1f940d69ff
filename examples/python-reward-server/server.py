#!/usr/bin/env python3
"""An rlq reward plugin over HTTP, in standard-library Python.

Serves two contracts on one URL (POST, JSON):

1. rlq's HTTP plugin contract (docs/plugins.md), for
   `custom_rm_path: http://127.0.0.1:8000/` (with or without `group_rm: true`):
     {"kind": "reward", "args": {...}, "sample": {...}}        -> {"result": {"score": 1.0, "pred": "42"}}
     {"kind": "reward_group", "args": {...}, "samples": [...]} -> {"result": [1.0, 0.0, ...]}
   plus the two filters, so one process can hold all of a project's Python rules:
     {"kind": "dynamic_filter", "args", "group": {"groupId", "rewards", "samples"}} -> {"result": {"keep": bool, "reason": str|null}}
     {"kind": "buffer_filter", "args", "rollout_id", "buffer": [...], "n": int}   -> {"result": first n of buffer}
2. slime's remote_rm body, for `rm_type: remote_rm` + `rm_url: http://127.0.0.1:8000/`:
     {"prompt": ..., "response": ..., "label": ...} -> {"score": 1.0, "pred": "42"}   (use reward_key: score)

The reward: 1.0 when the content of the last \\boxed{...} in the response equals
the label (both stripped), else 0.0. Replace `score()` with your own rule.

Run:  python3 server.py --port 8000
      (--port 0 picks a free port; the first stdout line is "listening on URL")
Fault injection for trying retries (never in production):
      --fail-first N     answer 500 to the first N requests
      --garbage-first N  then answer a non-JSON 200 to the next N
      --delay-ms D       sleep D ms before every answer
"""
import argparse
import json
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def last_boxed(text):
    """Content of the last \\boxed{...} (braces counted), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    out = []
    while i < len(text):
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return "".join(out)
        out.append(c)
        i += 1
    return None


def score(prompt, response, label):
    pred = last_boxed(response or "")
    ok = pred is not None and label is not None and pred.strip() == str(label).strip()
    return {"score": 1.0 if ok else 0.0, "pred": pred if pred is not None else ""}


def handle(body):
    """One request body -> (status, answer)."""
    kind = body.get("kind")
    if kind is None and "response" in body:  # slime remote_rm
        return 200, score(body.get("prompt"), body.get("response"), body.get("label"))
    if kind == "reward":
        s = body["sample"]
        return 200, {"result": score(s.get("prompt"), s.get("response"), s.get("label"))}
    if kind == "reward_group":
        return 200, {"result": [score(s.get("prompt"), s.get("response"), s.get("label"))["score"] for s in body["samples"]]}
    if kind == "dynamic_filter":
        rewards = body["group"]["rewards"]
        keep = len(rewards) > 1 and statistics.pstdev(rewards) > 0
        return 200, {"result": {"keep": keep, "reason": None if keep else "zero_std"}}
    if kind == "buffer_filter":
        return 200, {"result": body["buffer"][: body["n"]]}
    return 400, {"error": f"unknown kind {kind!r}; expected reward, reward_group, dynamic_filter or buffer_filter"}


class Handler(BaseHTTPRequestHandler):
    counter_lock = threading.Lock()
    counter = 0

    def do_POST(self):  # noqa: N802 (http.server's name)
        with Handler.counter_lock:
            Handler.counter += 1
            n = Handler.counter
        opts = self.server.opts
        if opts.delay_ms:
            time.sleep(opts.delay_ms / 1000)
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        if n <= opts.fail_first:
            return self.reply(500, {"error": f"injected failure {n}"})
        if n <= opts.fail_first + opts.garbage_first:
            return self.reply_raw(200, b"<html>upstream hiccup</html>", "text/html")
        try:
            body = json.loads(raw)
        except ValueError as e:
            return self.reply(400, {"error": f"body is not JSON: {e}"})
        try:
            status, answer = handle(body)
        except (KeyError, TypeError) as e:
            status, answer = 400, {"error": f"bad request: {type(e).__name__}: {e}"}
        self.reply(status, answer)

    def reply(self, status, value):
        self.reply_raw(status, json.dumps(value).encode(), "application/json")

    def reply_raw(self, status, data, content_type):
        try:
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (its timeout); it will retry

    def log_message(self, fmt, *args):  # quiet: one line per request on stderr only with --verbose
        if self.server.opts.verbose:
            sys.stderr.write("%s %s\n" % (self.address_string(), fmt % args))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--fail-first", type=int, default=0)
    p.add_argument("--garbage-first", type=int, default=0)
    p.add_argument("--delay-ms", type=int, default=0)
    p.add_argument("--verbose", action="store_true")
    opts = p.parse_args()
    server = ThreadingHTTPServer((opts.host, opts.port), Handler)
    server.opts = opts
    host, port = server.server_address[:2]
    print(f"listening on http://{host}:{port}/", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
