import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { engineHarness } from "../helpers/engine-harness.ts";
import { repoRoot } from "../helpers/processes.ts";
import { requirePythonModules } from "../helpers/python.ts";
import { fakeStats, request } from "../fakes/fake-engine-control.ts";
import { waitFor } from "../helpers/processes.ts";
import { createSglangServer } from "../../src/engines/sglang.ts";

/**
 * /update_weights_from_tensor, the same-host push (issue 15), against the fake
 * SGLang, which takes the body as the server does (io_struct.py
 * UpdateWeightsFromTensorReqInput; tokenizer_communicator_mixin.py
 * update_weights_from_tensor; tp_worker.py: one serialized entry per TP rank)
 * and answers /flush_cache as http_server.py does (plain text; 400 while
 * requests run). rlq's side is the torch trainer's rlq_torch/weight_push.py.
 *
 * Runs in rlq's Python environment (test/helpers/python.ts); fails, naming the command that builds it, without one.
 */
const python = requirePythonModules(["torch"]);
const TRAINER = join(repoRoot, "workers/trainer-torch");
const h = engineHarness("sglang");

function py(code: string): { status: number | null; out: string } {
  const r = spawnSync(python, ["-c", code], { cwd: TRAINER, encoding: "utf8", timeout: 120_000 });
  return { status: r.status, out: `${r.stdout}${r.stderr}` };
}

const post = async (url: string, path: string, body: unknown, key?: string) => {
  const res = await fetch(`${url}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...(key ? { authorization: `Bearer ${key}` } : {}) },
    body: JSON.stringify(body),
  });
  return { status: res.status, text: await res.text() };
};

describe("update_weights_from_tensor against the fake SGLang", () => {
  it("takes weight_push.serialize_named_tensors' blobs, one per TP rank, waits for running requests unless paused, and sets the version", async () => {
    const key = "push-key";
    const f = await h.fake(["--tp-size", "2", "--api-key", key, "--token-delay-ms", "5", "--stop-prob", "0"]);
    const made = py(
      "import torch\nfrom rlq_torch.weight_push import serialize_named_tensors\n" +
        "print(serialize_named_tensors([('w', torch.ones(2, 3)), ('b', torch.zeros(3))]))",
    );
    expect(made.status, made.out).toBe(0);
    const blob = made.out.trim().split("\n").at(-1) as string;
    const body = { serialized_named_tensors: [blob, blob], load_format: null, flush_cache: true, weight_version: "7" };

    // Refusals as the server's: a missing field (FastAPI validation, 400), too few entries for
    // the TP ranks, an entry that is not a serialized pickle (400 {success: false}).
    expect((await post(f.url, "/update_weights_from_tensor", {}, key)).status).toBe(400);
    const few = await post(f.url, "/update_weights_from_tensor", { ...body, serialized_named_tensors: [blob] }, key);
    expect(few.status).toBe(400);
    expect(JSON.parse(few.text)).toMatchObject({ success: false, message: expect.stringMatching(/one per TP rank/) });
    expect((await post(f.url, "/update_weights_from_tensor", { ...body, serialized_named_tensors: ["x", "y"] }, key)).status).toBe(400);
    expect((await post(f.url, "/update_weights_from_tensor", body)).status).toBe(401);

    // Not paused: the update waits for the running request (model_update_lock.writer_lock).
    const e = createSglangServer({ url: f.url, requestTimeoutMs: 20_000, isStreaming: false, apiKey: key });
    const running = e.generate(request("under-push", { maxNewTokens: 200, stopTokenIds: [] }));
    await waitFor("the request generating", async () => (await fakeStats(f.url)).live === 1);
    expect((await post(f.url, "/flush_cache", {}, key)).status).toBe(400); // a request is running
    const pushed = await post(f.url, "/update_weights_from_tensor", body, key);
    expect(pushed.status).toBe(200);
    // The request ran to its end on version 0 before the update applied.
    expect((await fakeStats(f.url)).live).toBe(0);
    const r = await running;
    expect(r).toMatchObject({ weightVersion: 0, finishReason: "length" });
    expect(r.tokenIds.length).toBe(200);
    const s = await fakeStats(f.url);
    expect(s.lastTensorPush).toMatchObject({ count: 2, load_format: null, flush_cache: true, weight_version: "7" });
    expect(s.cacheFlushes).toBe(1);
    const v = await fetch(`${f.url}/model_info`, { headers: { authorization: `Bearer ${key}` } });
    expect(await v.json()).toMatchObject({ weight_version: "7" });
    // Nothing runs now: /flush_cache answers 200 with its plain-text body.
    const flushed = await post(f.url, "/flush_cache", {}, key);
    expect(flushed).toMatchObject({ status: 200, text: expect.stringMatching(/^Cache flushed\./) });
  });

  // SGLang's /flush_cache answers plain text, and HTTP 400 while aborted requests drain
  // (http_server.py flush_cache): rlq_torch.weight_push reads either and retries the 400, as
  // slime's sglang_engine.py flush_cache does. The Python stand-in (tests/fake_push_engine.py) is kinder.
  it("rlq_torch.weight_push.push_from_tensor: pause → flush_cache → update_weights_from_tensor → continue, version read back", async () => {
    const key = "push-key-2";
    const f = await h.fake(["--tp-size", "2", "--api-key", key]);
    const r = py(
      "import torch\nfrom rlq_torch.weight_push import push_from_tensor\n" +
        `print(push_from_tensor(${JSON.stringify(f.url)}, [('w', torch.ones(2, 3))], 9, tp_size=2, api_key=${JSON.stringify(key)}))`,
    );
    const s = await fakeStats(f.url);
    expect(s.calls).toContain("continue_generation"); // always, even when the push failed
    expect(r.status, r.out).toBe(0);
    expect(s.calls).toEqual(["pause_generation", "flush_cache", "update_weights_from_tensor", "continue_generation"]);
    expect(s.lastTensorPush).toMatchObject({ count: 2, flush_cache: true, weight_version: "9" });
    expect(s.weightVersion).toBe(9);
  });
});
