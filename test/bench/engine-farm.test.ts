import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawnFake, type Proc } from "../helpers/processes.ts";
import { defaultParams, responseLength, type SimParams } from "../../bench/sim/model.ts";

// The engine farm (bench/sim/engine-farm.ts) over HTTP: SGLang's /generate (single and batch),
// /abort_request and /update_weights_from_disk as src/engines/sglang.ts calls them.
const p: SimParams = { ...defaultParams(2), timeScale: 50, tokenScale: 16, weightLoadMs: 500 };
let farm: Proc & { url: string };
/** Engine i's base URL: each simulated engine is its own server. */
let engineUrls: string[] = [];

/** A farm of two engines with these parameters, and each engine's base URL. */
async function startFarm(params: SimParams): Promise<{ farm: Proc & { url: string }; urls: string[] }> {
  const f = await spawnFake("bench/sim/engine-farm.ts", ["--engines", "2", "--params", JSON.stringify(params)]);
  const { ports } = (await (await fetch(`${f.url}/_ports`)).json()) as { ports: number[] };
  return { farm: f, urls: ports.map((port) => `http://127.0.0.1:${port}`) };
}

beforeAll(async () => {
  ({ farm, urls: engineUrls } = await startFarm(p));
});
afterAll(() => farm?.kill("SIGTERM"));

type Meta = { output_token_logprobs: Array<[number, number, null]>; finish_reason: { type: string }; weight_version: string };
async function post(path: string, body: unknown): Promise<unknown> {
  const [, i, rest] = /^\/e\/(\d+)(\/.*)$/.exec(path) as RegExpExecArray;
  const r = await fetch(`${engineUrls[Number(i)]}${rest}`, { method: "POST", body: JSON.stringify(body), headers: { "content-type": "application/json" } });
  expect(r.status).toBe(200);
  return r.json();
}
const expected = (key: string) => Math.ceil(responseLength(key, p) / p.tokenScale);

describe("engine farm", () => {
  it("answers a batch /generate with each sample's own length, ending in EOS (stop) or at the budget (length)", async () => {
    const rids = ["r-1-0-0", "r-1-1-0", "r-1-2-0"];
    const budget = 40;
    const outs = (await post("/e/0/generate", {
      rid: rids,
      input_ids: rids.map(() => [256, 65, 66]),
      return_logprob: true,
      stream: false,
      sampling_params: rids.map(() => ({ max_new_tokens: budget })),
    })) as Array<{ meta_info: Meta }>;
    expect(outs).toHaveLength(3);
    outs.forEach((o, i) => {
      const want = expected((rids[i] as string).slice(0, -2));
      const got = o.meta_info.output_token_logprobs;
      expect(got.length).toBe(Math.min(want, budget));
      expect(o.meta_info.finish_reason.type).toBe(want <= budget ? "stop" : "length");
      if (want <= budget) expect(got.at(-1)?.[1]).toBe(257);
    });
  });

  it("an aborted request returns its tokens so far, and the resumed segment ends where the sample would have", async () => {
    // Find a sample long enough to abort mid-way (at least 3 s of wall time at this scale).
    let key = "";
    for (let i = 0; !key; i++) if (responseLength(`long-${i}-0`, p) > 10_000) key = `long-${i}-0`;
    const total = expected(key);
    const totals = async () => ((await (await fetch(`${farm.url}/_totals`)).json()) as { tokens: number }).tokens;
    const before = await totals(); // engine 0 is idle now: what changes from here is engine 1's
    const first = post("/e/1/generate", {
      rid: `${key}-0`,
      input_ids: [256, 65],
      return_logprob: true,
      stream: false,
      sampling_params: { max_new_tokens: 2000 },
    }) as Promise<{ meta_info: Meta }>;
    // Abort once the farm has generated something: poll its totals (a fact), never a fixed sleep.
    for (;;) {
      if ((await totals()) - before > 16 * 20) break;
      await new Promise((r) => setTimeout(r, 20));
    }
    await post("/e/1/abort_request", { rid: `${key}-0` });
    const a = (await first).meta_info;
    expect(a.finish_reason.type).toBe("abort");
    expect(a.output_token_logprobs.length).toBeGreaterThan(0);
    expect(a.output_token_logprobs.length).toBeLessThan(total);
    const ids = a.output_token_logprobs.map((t) => t[1]);
    expect(ids.every((t) => t >= 128 && t <= 255)).toBe(true);
    // A weight load in between: the resumed segment reports the new version.
    const loaded = (await post("/e/1/update_weights_from_disk", { model_path: "/ckpt/1", weight_version: "1" })) as { success: boolean };
    expect(loaded.success).toBe(true);
    const b = (
      (await post("/e/1/generate", {
        rid: `${key}-1`,
        input_ids: [256, 65, ...ids],
        return_logprob: true,
        stream: false,
        sampling_params: { max_new_tokens: 2000 },
      })) as { meta_info: Meta }
    ).meta_info;
    expect(b.weight_version).toBe("1");
    expect(ids.length + b.output_token_logprobs.length).toBe(Math.min(total, ids.length + 2000));
  });

  it("abort_all ends every request on that engine with its tokens so far; streaming is refused", async () => {
    // Two long samples on engine 0 (each at least 3 s of wall time at this scale).
    const keys: string[] = [];
    for (let i = 0; keys.length < 2; i++) if (responseLength(`all-${i}-0`, p) > 10_000) keys.push(`all-${i}-0`);
    const totals = async () => ((await (await fetch(`${farm.url}/_totals`)).json()) as { tokens: number }).tokens;
    const before = await totals();
    const answers = keys.map(
      (key) =>
        post("/e/0/generate", {
          rid: `${key}-0`,
          input_ids: [256, 65],
          return_logprob: true,
          stream: false,
          sampling_params: { max_new_tokens: 2000 },
        }) as Promise<{
          meta_info: Meta;
        }>,
    );
    // Once both have generated something (the farm's totals: a fact, never a fixed sleep).
    for (;;) {
      if ((await totals()) - before > 2 * 16 * 20) break;
      await new Promise((r) => setTimeout(r, 20));
    }
    const r1 = await fetch(`${engineUrls[0]}/abort_request`, { method: "POST", body: JSON.stringify({ abort_all: true }) });
    expect(r1.status).toBe(200);
    for (const [i, a] of (await Promise.all(answers)).entries()) {
      expect(a.meta_info.finish_reason.type).toBe("abort");
      expect(a.meta_info.output_token_logprobs.length).toBeGreaterThan(0);
      expect(a.meta_info.output_token_logprobs.length).toBeLessThan(expected(keys[i] as string));
    }
    const r2 = await fetch(`${engineUrls[0]}/generate`, {
      method: "POST",
      body: JSON.stringify({ rid: "x-0-0-0", input_ids: [1], return_logprob: true, stream: true }),
    });
    expect(r2.status).toBe(400);
    expect(await r2.text()).toContain("stream: false");
  });
});

// http_server.py health_generate: a one-token generation, then a check every second for any
// output; 503 after SGLANG_HEALTH_CHECK_TIMEOUT (20 s) of none, as while a load holds the model
// update lock. A farm whose load (200 s of engine time, 4 s of wall time at this scale) outlasts
// that timeout many times over.
describe("engine farm health_generate", () => {
  const q: SimParams = { ...p, weightLoadMs: 200_000 };
  let slow: Proc & { url: string };
  let urls: string[] = [];
  beforeAll(async () => {
    ({ farm: slow, urls } = await startFarm(q));
  });
  afterAll(() => slow?.kill("SIGTERM"));
  const farmStats = async () => (await (await fetch(`${slow.url}/_stats`)).json()) as { healthChecks: number; healthBusy: number };

  it("answers 200 only after its first one-second check, 503 when a load holds the lock past the timeout, 200 again after the load", async () => {
    const t0 = performance.now();
    expect((await fetch(`${urls[0]}/health_generate`)).status).toBe(200);
    // A lower bound only (a timer never fires early): one second of engine time, 1000 / timeScale wall ms.
    expect(performance.now() - t0).toBeGreaterThanOrEqual(1000 / q.timeScale - 1);

    const load = fetch(`${urls[1]}/update_weights_from_disk`, {
      method: "POST",
      body: JSON.stringify({ model_path: "/ckpt/1", weight_version: "1" }),
      headers: { "content-type": "application/json" },
    });
    // The health check must begin after the load holds the lock: wait for the farm to say so.
    while (!((await (await fetch(`${slow.url}/_stats`)).json()) as { engines: Array<{ isLoading: boolean }> }).engines[1]?.isLoading) {
      await new Promise((r) => setTimeout(r, 5));
    }
    expect((await fetch(`${urls[1]}/health_generate`)).status).toBe(503);
    expect((await fetch(`${urls[0]}/health`)).status).toBe(200); // the other engine is not loading
    expect((await load).status).toBe(200);
    expect((await fetch(`${urls[1]}/health_generate`)).status).toBe(200);
    const s = await farmStats();
    expect(s.healthChecks).toBe(4);
    expect(s.healthBusy).toBe(1);
  });
});
