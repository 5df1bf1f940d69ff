import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { spawnRlq } from "../helpers/processes.ts";

/**
 * `rlq up --exit-when-done` on a run that pauses for a fault exits non-zero
 * with the reason (it used to wait forever, and exit 0 when its controller
 * died with the run still running). Here the engine serves version 4 of
 * another run and this run starts at 0 without ref_load: it pauses at start.
 */
describe("rlq up --exit-when-done on a paused run", () => {
  let w: World;
  beforeAll(async () => {
    w = await createWorld("upexit", { engineArgs: ["--weight-version", "4"] });
  });
  afterAll(async () => {
    await w?.close();
  });

  it("exits 1 and prints why the run is paused", async () => {
    const runId = await w.start({ num_rollout: 1 });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    let timer: NodeJS.Timeout | undefined;
    const code = await Promise.race([up.exited, new Promise((r) => (timer = setTimeout(() => r("still running after 90 s"), 90_000)))]);
    clearTimeout(timer);
    if (code === "still running after 90 s") {
      up.kill("SIGTERM");
      await up.exited;
    }
    expect(code, up.output().slice(-3000)).toBe(1);
    expect(up.output()).toMatch(new RegExp(`run ${runId} is paused: the engines serve weight version 4 .*no ref_load`));
    const r = (await w.db.pool.query("SELECT status FROM runs WHERE id = $1", [runId])).rows[0];
    expect(r.status).toBe("paused");
  }, 120_000);
});
