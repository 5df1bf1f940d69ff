import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { engineHarness, expectKeptAcrossLoad } from "../helpers/engine-harness.ts";
import { repoRoot, waitFor } from "../helpers/processes.ts";
import { requirePythonModules } from "../helpers/python.ts";
import { createSglangServer } from "../../src/engines/sglang.ts";
import { createEnginesFromConfig } from "../../src/engines/from-config.ts";
import { engineRuntimeDefaults, sglangEngineConfigSchema } from "../../src/engines/config-schema.ts";
import type { PoolLog } from "../../src/engines/pool.ts";
import { readSglangAnswer } from "../../src/engines/sglang-answer.ts";
import { fakeStats, pushInPlace, request, setFault, startFake } from "../fakes/fake-engine-control.ts";
import { listRouterWorkers } from "../../src/engines/sglang-router.ts";

/**
 * rlq against SGLang at its newest (issue 39, points 1-7), through the fake SGLang, which follows
 * python/sglang/srt/utils/auth.py (the admin key tier), entrypoints/http_server.py (the info
 * routes, the streamed error events), the Rust frontend (rust/sglang-server), the push routes' DP
 * assertion (managers/tokenizer_control_mixin.py) and the incremental stream's spans, and through
 * the fake gateway (lightseekorg/smg: runtime_type, the control plane's keys);
 * test/fakes/fake-sglang.ts and fake-sglang-router.ts cite each rule.
 */
const h = engineHarness("sglang");
const USER = "user-key-39";
const ADMIN = "admin-key-39";
const python = requirePythonModules(["torch"]);

function pool(url: string, keys: { apiKey?: string; adminApiKey?: string; isStreaming?: boolean } = {}, log?: PoolLog) {
  return h.pool([createSglangServer({ url, requestTimeoutMs: 10_000, ...keys })], { healthTimeoutMs: 2_000, ...(log ? { log } : {}) });
}
const post = async (url: string, path: string, key: string) =>
  (await fetch(`${url}${path}`, { method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${key}` }, body: "{}" })).status;

describe("SGLang --admin-api-key (utils/auth.py: both keys set, admin routes take only the admin key)", () => {
  it("with engine.admin_api_key, loads, aborts and flushes go with the admin key and generation with the plain key", async () => {
    const f = await h.fake(["--api-key", USER, "--admin-api-key", ADMIN, "--token-delay-ms", "5", "--stop-prob", "0"]);
    const config = sglangEngineConfigSchema.parse({ kind: "sglang", urls: [f.url], api_key: { env: "RLQ_T39_USER" }, admin_api_key: { env: "RLQ_T39_ADMIN" } });
    const p = h.trackPool(
      await createEnginesFromConfig(config, engineRuntimeDefaults({ rollout_health_check_interval: 0.2, rollout_health_check_timeout: 2 }), {
        envSource: { RLQ_T39_USER: USER, RLQ_T39_ADMIN: ADMIN },
      }),
    );
    await p.awaitReady(10_000);
    expect((await p.generate(request("gen-1", { maxNewTokens: 4 }))).finishReason).toBe("length");
    await p.loadWeights(1, "file:///tmp/rlq-ckpt/step-1");
    expect(await p.weightVersion()).toBe(1);
    const running = p.generate(request("long-1", { maxNewTokens: 5_000 }));
    await waitFor("the request generating", async () => (await fakeStats(f.url)).live === 1);
    await p.abort(["long-1"]);
    expect((await running).finishReason).toBe("abort");
    const s = await fakeStats(f.url);
    expect(s.abortRequests).toBeGreaterThan(0);
    expect(s.adminRefused).toBe(0);
    expect(s.unauthorized).toBe(0);
    // The fake holds SGLang's rule: /flush_cache (ADMIN_OPTIONAL) takes the admin key, not the plain one.
    expect(await post(f.url, "/flush_cache", ADMIN)).toBe(200);
    expect(await post(f.url, "/flush_cache", USER)).toBe(401);
    // ...and a NORMAL route takes the plain key, not the admin one.
    expect((await fetch(`${f.url}/model_info`, { headers: { authorization: `Bearer ${ADMIN}` } })).status).toBe(401);
    expect((await fetch(`${f.url}/model_info`, { headers: { "x-api-key": USER } })).status).toBe(200);
  });

  it("with the plain key alone, the refusal is engine_admin_unauthorized naming engine.admin_api_key: loads fail by name, aborts are logged and cancelled locally", async () => {
    const f = await h.fake(["--api-key", USER, "--admin-api-key", ADMIN, "--token-delay-ms", "5", "--stop-prob", "0"]);
    const lines: string[] = [];
    const log: PoolLog = { info: () => undefined, warn: (o, m) => lines.push(`${m} ${JSON.stringify(o)}`) };
    const p = pool(f.url, { apiKey: USER }, log);
    await p.awaitReady(10_000);
    expect((await p.generate(request("gen-2", { maxNewTokens: 4 }))).finishReason).toBe("length");
    const running = p.generate(request("long-2", { maxNewTokens: 5_000 }));
    await waitFor("the request generating", async () => (await fakeStats(f.url)).live === 1);
    await p.abort(["long-2"]);
    expect((await running).finishReason).toBe("abort");
    expect(lines.some((l) => l.startsWith("abort refused") && l.includes("engine_admin_unauthorized") && l.includes("engine.admin_api_key"))).toBe(true);
    // The load is refused by name: the pool's error and the log line of the engine leaving the rotation both name the key to set.
    const load = p.loadWeights(1, "file:///tmp/rlq-ckpt/step-1");
    await expect(load).rejects.toMatchObject({ code: "engine_load_failed", isRetriable: false });
    await expect(load).rejects.toThrow(/update_weights_from_disk: HTTP 401: admin call refused: .*set engine\.admin_api_key/);
    expect(lines.some((l) => l.startsWith("engine left the rotation") && l.includes("engine.admin_api_key"))).toBe(true);
    expect((await fakeStats(f.url)).adminRefused).toBeGreaterThanOrEqual(2);
    // The wrong admin key is named as such.
    const wrong = createSglangServer({ url: f.url, requestTimeoutMs: 10_000, apiKey: USER, adminApiKey: "not-it" });
    await expect(wrong.abort(["nobody"])).rejects.toMatchObject({ code: "engine_admin_unauthorized", status: 401 });
    await expect(wrong.abort(["nobody"])).rejects.toThrow(/engine\.admin_api_key is not the key the server was started with/);
  });

  it("the trainer's push sends the admin key (--push-admin-api-key-env); the plain key is refused with the flag to set", async () => {
    const f = await h.fake(["--api-key", USER, "--admin-api-key", ADMIN]);
    const push = (env: Record<string, string>, flags: string) => {
      const code =
        "import os, types, torch\nfrom rlq_torch.weight_push import push_api_key, push_from_tensor\n" +
        `args = types.SimpleNamespace(${flags})\n` +
        `print(push_from_tensor(${JSON.stringify(f.url)}, [('w', torch.ones(2, 3))], 4, api_key=push_api_key(args, os.environ)))`;
      const r = spawnSync(python, ["-c", code], {
        cwd: join(repoRoot, "workers/trainer-torch"),
        encoding: "utf8",
        timeout: 120_000,
        env: { ...process.env, ...env },
      });
      return { status: r.status, out: `${r.stdout}${r.stderr}` };
    };
    const refused = push({ K_USER: USER }, "push_api_key_env='K_USER', push_admin_api_key_env=None");
    expect(refused.status).not.toBe(0);
    expect(refused.out).toMatch(/pause_generation: HTTP 401: .*--push-admin-api-key-env/);
    const pushed = push({ K_USER: USER, K_ADMIN: ADMIN }, "push_api_key_env='K_USER', push_admin_api_key_env='K_ADMIN'");
    expect(pushed.status, pushed.out).toBe(0);
    expect((await fakeStats(f.url)).weightVersion).toBe(4);
  });
});

describe("info routes (http_server.py: /model_info, /server_info; /get_* deprecated; /get_weight_version gone)", () => {
  it("newest layout: admission, the version and the seed question use /model_info and /server_info only", async () => {
    const f = await h.fake(["--weight-version", "2"]);
    expect((await fetch(`${f.url}/get_weight_version`)).status).toBe(404);
    const p = pool(f.url);
    await p.awaitReady(10_000);
    expect(await p.weightVersion()).toBe(2);
    expect(p.snapshot().engines[0]?.seedHonoured).toBe(true);
    expect((await fakeStats(f.url)).deprecatedCalls).toBe(0);
  });

  it("0.5.x layout (no /model_info, /server_info): rlq falls back to /get_model_info, /get_server_info on their 404", async () => {
    const f = await h.fake(["--api-layout", "0.5", "--weight-version", "5"]);
    expect((await fetch(`${f.url}/model_info`)).status).toBe(404);
    const p = pool(f.url);
    await p.awaitReady(10_000);
    expect(await p.weightVersion()).toBe(5);
    expect(p.snapshot().engines[0]?.seedHonoured).toBe(true);
    expect((await p.generate(request("old-1", { maxNewTokens: 4 }))).weightVersion).toBe(5);
  });
});

describe("streamed error events {message, type, code, retryable} (http_server.py generate_request)", () => {
  it("a retryable error event is handled as a 5xx is: the tokens so far come back as a resumable partial, or with none the request starts over", async () => {
    const a = await h.fake(["--stop-prob", "0"]);
    const b = await h.fake(["--stop-prob", "0"]);
    const p = h.pool(
      [a.url, b.url].map((url) => createSglangServer({ url, requestTimeoutMs: 10_000, isStreaming: true })),
      { healthTimeoutMs: 2_000 },
    );
    await p.awaitReady(10_000);
    const generated = async () => (await fakeStats(a.url)).generate + (await fakeStats(b.url)).generate;
    for (const f of [a, b]) await setFault(f.url, { mode: "error_event", statusCode: 503, retryable: true, afterTokens: 3, count: 1 });
    const partial = await p.generate(request("retry-1", { maxNewTokens: 8 }));
    expect(partial).toMatchObject({ finishReason: "abort" });
    expect(partial.tokenIds.length).toBe(3);
    for (const f of [a, b]) await setFault(f.url, { mode: "error_event", statusCode: 503, retryable: true, afterTokens: 0, count: 1 });
    const before = await generated();
    const whole = await p.generate(request("retry-2", { maxNewTokens: 8 }));
    expect(whole).toMatchObject({ finishReason: "length" });
    expect(whole.tokenIds.length).toBe(8);
    // Each failed attempt consumed one cued event (one per fake): the request ran once more than that.
    const left = await Promise.all([a, b].map(async (f) => ((await (await fetch(`${f.url}/_fault`)).json()) as { count: number }).count));
    const events = left.filter((c) => c === 0).length;
    expect(events).toBeGreaterThanOrEqual(1);
    expect((await generated()) - before).toBe(events + 1);
  });

  it("a non-retryable 4xx error event fails that request by name, once", async () => {
    const f = await h.fake(["--stop-prob", "0"]);
    const p = pool(f.url, { isStreaming: true });
    await p.awaitReady(10_000);
    const before = (await fakeStats(f.url)).generate;
    await setFault(f.url, { mode: "error_event", statusCode: 422, retryable: false, afterTokens: 3, count: 1 });
    await expect(p.generate(request("fail-1", { maxNewTokens: 8 }))).rejects.toMatchObject({
      code: "engine_request_rejected",
      isRetriable: false,
      message: expect.stringMatching(/injected error 422 \(code 422, retryable false\)/),
    });
    expect((await fakeStats(f.url)).generate - before).toBe(1);
    expect(p.snapshot().engines[0]).toMatchObject({ state: "healthy", deaths: 0 });
  });

  it("readSglangAnswer: retryable or a bare 5xx code retries; 0.5.x's bare message and retryable false fail the request", () => {
    const read = (error: unknown) => {
      try {
        readSglangAnswer({ error }, "t");
      } catch (e) {
        return { code: (e as { code: string }).code, isRetriable: (e as { isRetriable: boolean }).isRetriable };
      }
      return null;
    };
    expect(read({ message: "m", code: 400, retryable: true })).toEqual({ code: "engine_http_error", isRetriable: true });
    expect(read({ message: "m", code: 500 })).toEqual({ code: "engine_http_error", isRetriable: true });
    expect(read({ message: "m", code: 500, retryable: false })).toEqual({ code: "engine_request_rejected", isRetriable: false });
    expect(read({ message: "m" })).toEqual({ code: "engine_request_rejected", isRetriable: false });
  });
});

describe("incremental streaming across an in-place update (tokenizer_manager.py slices only the log-prob keys)", () => {
  it("a delta event carries every span and the new weight_version: every token keeps the version that sampled it, the request runs on", async () => {
    const f = await h.fake(["--token-delay-ms", "4", "--stop-prob", "0", "--weight-versions-spans", "--incremental-streaming-output"]);
    const e = createSglangServer({ url: f.url, requestTimeoutMs: 10_000, isStreaming: true });
    const pending = e.generate(request("inc-span", { maxNewTokens: 300, stopTokenIds: [], seed: 9 }));
    await waitFor("tokens flowing", async () => (await fakeStats(f.url)).tokensGenerated >= 10);
    await pushInPlace(f.url, 5);
    // The delta events' spans apply to the whole output held so far: the request ran to its length,
    // the tokens before the push labelled 0 and the ones after it 5 (never the delta's newest version
    // for all); the version-0 tokens are those of a server that never moved, same seed.
    await expectKeptAcrossLoad(await pending, { length: 300, pushed: 5, seed: 9, minCut: 10, reference: await h.fake(["--stop-prob", "0"]) });
    // Nothing was aborted: the request ended by itself on the server.
    await waitFor("the request ended on the server", async () => (await fakeStats(f.url)).live === 0);
    expect((await fakeStats(f.url)).abortRequests).toBe(0);
  });
});

describe("the Rust frontend (SGLANG_RUST_SERVER; /server_info frontend rust)", () => {
  it("is refused at admission for a run that loads or pushes weights, naming why; with weight_sync none it serves and its requests are cancelled by closing", async () => {
    const f = await h.fake(["--frontend", "rust", "--token-delay-ms", "5", "--stop-prob", "0"]);
    expect((await fetch(`${f.url}/abort_request`, { method: "POST", body: "{}" })).status).toBe(404);
    expect(((await (await fetch(`${f.url}/server_info`)).json()) as { frontend: string }).frontend).toBe("rust");
    for (const weightSync of ["disk", "trainer_push"] as const) {
      const e = createSglangServer({ url: f.url, requestTimeoutMs: 10_000, weightSync });
      await expect(e.checkServer()).rejects.toMatchObject({
        code: "engine_cannot_load",
        isRetriable: false,
        message: expect.stringMatching(
          new RegExp(`runs the Rust frontend .*SGLANG_RUST_SERVER.*no /abort_request.*weight_sync ${weightSync}.*weight_sync: none`),
        ),
      });
    }
    const frozen = createSglangServer({ url: f.url, requestTimeoutMs: 10_000, weightSync: "none" });
    const p = h.pool([frozen], { healthTimeoutMs: 2_000 });
    await p.awaitReady(10_000);
    expect(frozen.canAbortById).toBe(false);
    expect(await p.generate(request("rust-1", { maxNewTokens: 4 }))).toMatchObject({ finishReason: "length", weightVersion: 0 });
    const running = p.generate(request("rust-2", { maxNewTokens: 5_000 }));
    await waitFor("the request generating", async () => (await fakeStats(f.url)).live === 1);
    await p.abort(["rust-2"]);
    expect((await running).finishReason).toBe("abort");
    expect((await fakeStats(f.url)).abortRequests).toBe(0);
  });
});

describe("--dp-size > 1 without DP attention (tokenizer_control_mixin.py: the push routes assert dp_size == 1 or enable_dp_attention)", () => {
  it("trainer_push is refused at admission naming the flags; disk loads are not; with DP attention pushes are admitted", async () => {
    const f = await h.fake(["--dp-size", "2"]);
    // The fake's push answers as SGLang's does: the AssertionError is an HTTP 500.
    const group = { master_address: "127.0.0.1", master_port: 1, rank_offset: 1, world_size: 2, group_name: "g" };
    const pushed = await fetch(`${f.url}/init_weights_update_group`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(group),
    });
    expect({ status: pushed.status, text: await pushed.text() }).toEqual({ status: 500, text: "Internal Server Error" });
    await expect(createSglangServer({ url: f.url, requestTimeoutMs: 10_000, weightSync: "trainer_push" }).checkServer()).rejects.toMatchObject({
      code: "engine_cannot_load",
      isRetriable: false,
      message: expect.stringMatching(/--dp-size 2 without --enable-dp-attention.*HTTP 500.*--dp-size 1.*--enable-dp-attention.*weight_sync: disk/),
    });
    await expect(createSglangServer({ url: f.url, requestTimeoutMs: 10_000, weightSync: "disk" }).checkServer()).resolves.toBeUndefined();
    const g = await h.fake(["--dp-size", "2", "--enable-dp-attention"]);
    await expect(createSglangServer({ url: g.url, requestTimeoutMs: 10_000, weightSync: "trainer_push" }).checkServer()).resolves.toBeUndefined();
  });
});

describe("gateway discovery (lightseekorg/smg: runtime_type, control-plane keys)", () => {
  it("only SGLang workers are driven; vLLM workers behind the gateway are left out and logged", async () => {
    const a = await h.fake();
    const v = await h.fake();
    const router = h.track(await startFake("sglang-router", ["--workers", a.url, "--vllm-workers", v.url]));
    const skipped: string[] = [];
    expect(await listRouterWorkers(router.url, { onSkipped: (url, why) => skipped.push(`${url}: ${why}`) })).toEqual([a.url]);
    expect(skipped).toEqual([`${v.url}: runtime_type vllm: not an SGLang server (configure it as its own engine, e.g. engine.kind openai for vLLM)`]);
    const lines: string[] = [];
    const log: PoolLog = { info: () => undefined, warn: (o, m) => lines.push(`${m} ${JSON.stringify(o)}`) };
    const p = h.trackPool(
      await createEnginesFromConfig(
        sglangEngineConfigSchema.parse({ kind: "sglang", router_url: router.url, router_refresh_s: 0 }),
        engineRuntimeDefaults({ rollout_health_check_interval: 0.2, rollout_health_check_timeout: 2 }),
        { log },
      ),
    );
    expect(Object.keys(p.engineStates())).toEqual([a.url]);
    expect(lines.some((l) => l.startsWith("router worker left out") && l.includes(v.url) && l.includes("runtime_type vllm"))).toBe(true);
  });

  it("a gateway with per-tenant keys denies /workers: the error names engine.router_api_key and the gateway's shared --api-key", async () => {
    const a = await h.fake();
    const tenants = h.track(await startFake("sglang-router", ["--workers", a.url, "--tenant-keys", "team-red,team-blue"]));
    await expect(listRouterWorkers(tenants.url, { apiKey: "team-red" })).rejects.toMatchObject({
      code: "engine_unauthorized",
      isRetriable: false,
      message: expect.stringMatching(/\/workers: HTTP 401: .*never a per-tenant key.*set engine\.router_api_key to the gateway's shared --api-key/),
    });
    const shared = h.track(await startFake("sglang-router", ["--workers", a.url, "--tenant-keys", "team-red", "--api-key", "admin-1"]));
    await expect(listRouterWorkers(shared.url, { apiKey: "team-red" })).rejects.toMatchObject({ code: "engine_unauthorized" });
    expect(await listRouterWorkers(shared.url, { apiKey: "admin-1" })).toEqual([a.url]);
  });
});
