import { describe, expect, it } from "vitest";
import { engineHarness } from "../helpers/engine-harness.ts";
import { createSglangServer } from "../../src/engines/sglang.ts";
import type { RemoteEngine } from "../../src/engines/remote.ts";
import { fakeStats } from "../fakes/fake-engine-control.ts";

/**
 * weight_update_mode in_place at the pool (core/weight-sync.ts `SyncStrategy`): a load that keeps
 * the engines' requests needs each engine's adapter to pause in place (engines/pool-types.ts
 * `InPlacePause`). SGLang's does: POST /pause_generation {mode: in_place}, the load, then
 * /continue_generation (newest tokenizer_manager.py update_weights_from_disk loads at once while the
 * engine is paused). An adapter without it is refused by name before any engine is asked to load,
 * so no engine is left on another version than the others. weight_load_max_engines staggers the
 * loads (core/staggered-load.ts).
 */
const h = engineHarness("sglang");

/** The SGLang adapter without its in-place pause: an engine rlq cannot pause keeping its requests. */
function withoutInPlacePause(e: RemoteEngine): RemoteEngine {
  return new Proxy(e, {
    get: (target, key) => (key === "pauseInPlace" || key === "resumeInPlace" ? undefined : (Reflect.get(target, key, target) as unknown)),
  });
}

describe("weight sync in place", () => {
  it("pauses each SGLang engine in place around its load, and continues it", async () => {
    const f = await h.fake();
    const p = h.pool([createSglangServer({ url: f.url, requestTimeoutMs: 10_000, isStreaming: true })]);
    await p.awaitReady(10_000);
    await p.loadWeights(1, "file:///tmp/rlq-ckpt/step-0", undefined, { keepRequests: true });
    const stats = await fakeStats(f.url);
    const order = stats.calls.filter((c) => ["pause_generation", "update_weights_from_disk", "continue_generation"].includes(c));
    expect(order).toEqual(["pause_generation", "update_weights_from_disk", "continue_generation"]);
    expect(stats.loads).toBe(1);
    expect(p.currentVersion()).toBe(1);
  });

  it("staggered, loads every engine and tells each as its own load ends", async () => {
    const fs = await Promise.all([h.fake(), h.fake(), h.fake()]);
    const p = h.pool(fs.map((f) => createSglangServer({ url: f.url, requestTimeoutMs: 10_000, isStreaming: true })));
    await p.awaitReady(10_000);
    const loaded: string[] = [];
    await p.loadWeights(1, "file:///tmp/rlq-ckpt/step-0", (id) => loaded.push(id), { keepRequests: true, maxLoadingEngines: 1 });
    expect(loaded).toHaveLength(3);
    for (const f of fs) expect((await fakeStats(f.url)).loads).toBe(1);
    expect(p.currentVersion()).toBe(1);
  });

  it("refuses engines whose adapter cannot pause keeping its requests, naming them, and loads nothing", async () => {
    const f = await h.fake();
    const p = h.pool([withoutInPlacePause(createSglangServer({ url: f.url, requestTimeoutMs: 10_000, isStreaming: true }))]);
    await p.awaitReady(10_000);
    await expect(p.loadWeights(1, "file:///tmp/rlq-ckpt/step-0", undefined, { keepRequests: true })).rejects.toMatchObject({
      code: "engine_cannot_load",
      message: expect.stringContaining(f.url),
    });
    expect((await fakeStats(f.url)).loads).toBe(0);
    expect(p.currentVersion()).toBe(0);
  });
});
