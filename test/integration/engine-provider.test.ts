import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { waitFor } from "../helpers/processes.ts";
import { request } from "../fakes/fake-engine-control.ts";
import { appendDecisions } from "../../src/store/decision-log.ts";
import { projectRunInTx } from "../../src/store/projections.ts";
import { createRunContextCache } from "../../src/runtime/run-context.ts";
import { createEngineProvider } from "../../src/runtime/engines.ts";

/**
 * A rollout worker's engines (runtime/engines.ts) learn a weight sync from the
 * controller's commit (`rlq_synced`), before any job at the new version reaches
 * them: the pool routes to the new version as soon as its engines report it.
 */
describe("engine provider", () => {
  let world: World;
  beforeAll(async () => {
    world = await createWorld("engprov");
  });
  afterAll(async () => {
    await world.close();
  });

  it("weights.synced committed by the controller moves the worker's pool to the version before a job asks for it", async () => {
    const runId = await world.start();
    const ctx = await createRunContextCache(world.db).get(runId);
    const provider = createEngineProvider(world.db, null);
    try {
      // A job at version 0 made this process's pool for the run (pinned to 0: health rounds no longer move it).
      await provider.engineFor(ctx, 0);
      const pool = () => provider.metrics()[0]?.snapshot;
      expect(pool()?.currentVersion).toBe(0);
      // The controller loads version 1 into the engine, then records it, as step-blocks.ts syncEngines does.
      const load = await fetch(`${world.engine.url}/update_weights_from_disk`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model_path: "/step-0", weight_version: "1" }),
      });
      expect(load.ok).toBe(true);
      await appendDecisions(
        world.db,
        runId,
        0,
        2,
        [{ kind: "weights.synced", payload: { step: 0, weightVersion: 1, checkpointUri: "file:///step-0" } }],
        (tx) => projectRunInTx(tx, runId, { weightVersion: 1 }),
      );
      const engine = await waitFor("the pool routes to version 1", () => {
        const s = pool();
        return s?.currentVersion === 1 && s.engines.every((e) => e.state === "healthy" && e.weightVersion === 1) ? s : null;
      });
      expect(engine.engines.length).toBe(1);
      // A job at version 1 now generates on it at once.
      const e = await provider.engineFor(ctx, 1);
      expect((await e.generate(request("after-sync", { maxNewTokens: 3 }))).weightVersion).toBe(1);
    } finally {
      await provider.close();
    }
  });
});
