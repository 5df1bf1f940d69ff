import { createHash } from "node:crypto";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { spawnRlq } from "../helpers/processes.ts";
import { solidPng } from "../helpers/png.ts";
import {
  RED_PNG,
  engineImagesBySegment,
  expectBatchImages,
  imageObservationConfig,
  segmentsBySample,
  type SegmentRow,
  writeRedImagePrompts,
} from "../helpers/image-observation.ts";
import { sha256Hex } from "../../src/lib/hash.ts";
import { startRun } from "../../src/api.ts";

/**
 * A multi-turn VLM agent: a custom generate function whose tool turn returns an image. On the fake
 * SGLang (which records each request's image_data by hash and folds the hashes into its answer),
 * the engine call after the observation must carry the prompt's image then the observation's; the
 * history records the observation on its segment, and the step's batch, as served to the trainer,
 * carries both images for every sample.
 */
const AGENT = `
import { fileURLToPath } from "node:url";
const green = fileURLToPath(new URL("./green.png", import.meta.url));
export async function generate(_args, sample, { generate, tool, remainingTokens, imagePlaceholder }) {
  if (!imagePlaceholder) throw new Error("no image placeholder");
  const turns = [];
  const first = await generate(turns, { maxNewTokens: 4 });
  turns.push(first);
  if (first.finishReason === "abort") return { turns };
  const obs = tool("\\n<obs>" + imagePlaceholder + "</obs>\\n", { images: [green] });
  if (obs.tokens.length > remainingTokens(turns)) return { turns, status: "truncated" };
  turns.push(obs);
  turns.push(await generate(turns, { maxNewTokens: 4 }));
  return { turns, status: "completed" };
}
`;

describe("a custom generate function with an image observation", () => {
  let w: World;
  beforeAll(async () => {
    w = await createWorld("imgobs");
  });
  afterAll(async () => {
    await w?.close();
  });

  it("sends prompt + observation images on the later request, records the observation by hash, and trains on both", async () => {
    const dir = join(w.home, "data");
    const promptData = writeRedImagePrompts(dir, 4);
    const green = solidPng([0, 255, 0]);
    writeFileSync(join(dir, "green.png"), green);
    writeFileSync(join(dir, "agent.mjs"), AGENT);
    process.env.RLQ_HOME = w.home;
    const { runId } = await startRun(w.db, { config: w.baseConfig(imageObservationConfig(promptData, join(dir, "agent.mjs"))) });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    expect(await up.exited, up.output()).toBe(0);

    const redSha = sha256Hex(RED_PNG);
    const greenSha = sha256Hex(green);
    // The history: the observation's image on the segment whose tokens hold its placeholder.
    const samples = await segmentsBySample(w.db, runId);
    expect(samples.size).toBe(4);
    for (const [key, list] of samples) {
      expect(
        list.map((r) => r.segment_index),
        key,
      ).toEqual([0, 1]);
      expect(list[0]?.images, key).toEqual([
        {
          type: "image",
          key: "observation",
          sha256: greenSha,
          byteLength: green.byteLength,
          mime: "image/png",
          origin: "path",
          source: join(dir, "green.png"),
          path: join(dir, "green.png"),
        },
      ]);
      expect(list[1]?.images, key).toBeNull();
      // The observation (placeholder included) is not trained on.
      const mask = list[0]?.loss_mask ?? [];
      expect(mask.filter((m) => m === 0).length).toBeGreaterThan(0);
    }

    // The engine: segment 0 was sent the prompt's image; segment 1 the prompt's then the observation's.
    const imagesOf = await engineImagesBySegment(w.engine.url, runId);
    for (const list of samples.values()) {
      const { group_id: g, sample_index: s } = list[0] as SegmentRow;
      expect(imagesOf(g, s, 0), `${g}-${s}-0`).toEqual([redSha]);
      expect(imagesOf(g, s, 1), `${g}-${s}-1`).toEqual([redSha, greenSha]);
    }

    // The step's batch as served (its digest, reported by the fake trainer) is the one built here,
    // and each sample carries the prompt's image then the observation's, bytes included.
    const encoded = await expectBatchImages(w.db, runId, [redSha, greenSha]);
    const digest = Number.parseInt(createHash("sha256").update(encoded).digest("hex").slice(0, 12), 16);
    const served = await w.db.pool.query("SELECT value FROM train_metrics WHERE run_id = $1 AND key = 'batch_digest48' AND step = 0", [runId]);
    expect(served.rows[0]?.value).toBe(digest);
  });
});
