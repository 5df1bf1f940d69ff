import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createTestDatabase } from "../helpers/services.ts";
import { createDb, type Db } from "../../src/store/db.ts";
import { historyRows } from "../../src/store/history.ts";
import { insertHistory } from "../../src/store/projections.ts";
import { assembleSample } from "../../src/core/sample.ts";

/**
 * A byte tokenizer can sample byte 0, and Postgres text cannot hold NUL: the
 * rollout_history insert of such a response failed and stopped the controller
 * (issue 15). The decoded text is stored with U+FFFD in its place; the token
 * ids stay exact.
 */
describe("rollout_history with a NUL byte in the response", () => {
  let db: Db;
  let drop: () => Promise<void>;
  beforeAll(async () => {
    const database = await createTestDatabase("rlq_histnul");
    drop = () => database.drop();
    db = createDb(database.url, { max: 2 });
  });
  afterAll(async () => {
    await db?.close();
    await drop?.();
  });

  it("is written, the text with U+FFFD and the tokens exact", async () => {
    const tokens = [72, 0, 105, 257];
    const sample = assembleSample(0, [
      {
        sampleIndex: 0,
        segmentIndex: 0,
        round: 0,
        weightVersion: 0,
        tokens,
        logProbs: tokens.map(() => -1),
        lossMask: tokens.map(() => 1),
        finishReason: "stop",
        status: "completed",
        engine: "e",
      },
    ]);
    const view = {
      groupId: 0,
      prompt: { drawOrdinal: 0, epoch: 0, datasetIndex: 0, step: 0, prompt: "p\u0000q", label: null, metadata: {}, promptTokens: [256, 0] },
      samples: [sample],
    };
    const decode = (ids: readonly number[]) =>
      ids
        .filter((i) => i < 256)
        .map((i) => String.fromCharCode(i))
        .join("");
    await db.db.transaction((tx) => insertHistory(tx, historyRows("run-nul", 0, view, null, "kept", "reason\u0000", decode, null)));
    const r = await db.pool.query("SELECT prompt, response, tokens, outcome_reason FROM rollout_history WHERE run_id = 'run-nul'");
    expect(r.rows).toEqual([{ prompt: "p\uFFFDq", response: "H\uFFFDi", tokens: [256, 0, 72, 0, 105, 257], outcome_reason: "reason\uFFFD" }]);
  });
});
