import { describe, expect, it } from "vitest";
import { engineHarness } from "../helpers/engine-harness.ts";
import { createSglangServer } from "../../src/engines/sglang.ts";
import { fakeStats } from "../fakes/fake-engine-control.ts";

/**
 * weight_update_mode in_place at the pool (core/weight-sync.ts `SyncStrategy`): a load that keeps
 * the engines' requests needs each engine's adapter to pause in place (engines/pool-types.ts
 * `InPlacePause`). An adapter without it is refused by name before any engine is asked to load,
 * so no engine is left on another version than the others.
 */
const h = engineHarness("sglang");

describe("weight sync in place", () => {
  it("refuses engines whose adapter cannot pause keeping its requests, naming them, and loads nothing", async () => {
    const f = await h.fake();
    const p = h.pool([createSglangServer({ url: f.url, requestTimeoutMs: 10_000, isStreaming: true })]);
    await p.awaitReady(10_000);
    await expect(p.loadWeights(1, "file:///tmp/rlq-ckpt/step-0", undefined, { keepRequests: true })).rejects.toMatchObject({
      code: "engine_cannot_load",
      message: expect.stringContaining(f.url),
    });
    expect((await fakeStats(f.url)).loads).toBe(0);
    expect(p.currentVersion()).toBe(0);
  });
});
