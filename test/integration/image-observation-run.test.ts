import { createHash } from "node:crypto";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWorld, type World } from "../helpers/run-fixture.ts";
import { spawnRlq } from "../helpers/processes.ts";
import { visionChatTokenizerDir } from "../helpers/chat-tokenizer.ts";
import { solidPng } from "../helpers/png.ts";
import { fakeStats } from "../fakes/fake-engine-control.ts";
import { sha256Hex } from "../../src/lib/hash.ts";
import { startRun } from "../../src/api.ts";
import { loadTrainBatch } from "../../src/jobs/train-batch.ts";
import { decodeBatch, encodeBatch } from "../../src/trainer/batch-codec.ts";
import { loadRunRow } from "../../src/store/run-facts.ts";
import { decodeRecordedConfig } from "../../src/config/recorded-config.ts";
import type { RunContext } from "../../src/runtime/run-context.ts";

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
    mkdirSync(dir, { recursive: true });
    const red = solidPng([255, 0, 0]);
    const green = solidPng([0, 255, 0]);
    writeFileSync(join(dir, "red.png"), red);
    writeFileSync(join(dir, "green.png"), green);
    writeFileSync(join(dir, "agent.mjs"), AGENT);
    const rows = Array.from({ length: 4 }, (_, i) => ({ input: `Q${i}: what colour?`, label: "green", images: ["red.png"] }));
    writeFileSync(join(dir, "d.jsonl"), rows.map((r) => JSON.stringify(r)).join("\n"));
    process.env.RLQ_HOME = w.home;
    const { runId } = await startRun(w.db, {
      config: w.baseConfig({
        prompt_data: join(dir, "d.jsonl"),
        multimodal_keys: { image: "images" },
        apply_chat_template: true,
        hf_checkpoint: visionChatTokenizerDir(),
        custom_generate_function_path: join(dir, "agent.mjs"),
        num_rollout: 1,
        rollout_batch_size: 2,
        n_samples_per_prompt: 2,
        over_sampling_batch_size: null,
        dynamic_sampling_filter_path: null,
        rollout_max_response_len: 128,
      }),
    });
    const up = spawnRlq(["up", "--run", runId, "--exit-when-done"], w.env);
    expect(await up.exited, up.output()).toBe(0);

    const redSha = sha256Hex(red);
    const greenSha = sha256Hex(green);
    // The history: the observation's image on the segment whose tokens hold its placeholder.
    const segs = await w.db.pool.query(
      `SELECT s.group_id, s.sample_index, s.segment_index, s.images, s.loss_mask, s.tokens
         FROM sample_segments s WHERE s.run_id = $1 ORDER BY s.group_id, s.sample_index, s.segment_index`,
      [runId],
    );
    const samples = new Map<string, typeof segs.rows>();
    for (const r of segs.rows) samples.set(`${r.group_id}-${r.sample_index}`, [...(samples.get(`${r.group_id}-${r.sample_index}`) ?? []), r]);
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
      const mask = list[0]?.loss_mask as number[];
      expect(mask.filter((m) => m === 0).length).toBeGreaterThan(0);
    }

    // The engine: segment 0 was sent the prompt's image; segment 1 the prompt's then the observation's.
    const seen = (await fakeStats(w.engine.url)).imagesSeen;
    const imagesOf = (group: number, sample: number, segment: number) =>
      Object.entries(seen).find(([rid]) => rid.startsWith(`${runId}-${group}-${sample}-${segment}.`) || rid === `${runId}-${group}-${sample}-${segment}`)?.[1];
    for (const list of samples.values()) {
      const { group_id: g, sample_index: s } = list[0] as { group_id: string; sample_index: number };
      expect(imagesOf(Number(g), s, 0), `${g}-${s}-0`).toEqual([redSha]);
      expect(imagesOf(Number(g), s, 1), `${g}-${s}-1`).toEqual([redSha, greenSha]);
    }

    // The step's batch as served (its digest, reported by the fake trainer) is the one built here,
    // and each sample carries the prompt's image then the observation's, bytes included.
    const ctx = { runId, config: decodeRecordedConfig((await loadRunRow(w.db, runId))?.config, `run ${runId} config`) } as RunContext;
    const { batch } = await loadTrainBatch(w.db, ctx, 0);
    expect(batch.samples).toHaveLength(4);
    for (const s of batch.samples) expect(s.images?.map((i) => i.sha256)).toEqual([redSha, greenSha]);
    const encoded = encodeBatch({ ...batch, runId: "" });
    const decoded = decodeBatch(encoded);
    for (const s of decoded.samples) expect(s.images?.map((i) => sha256Hex(i.bytes as Uint8Array))).toEqual([redSha, greenSha]);
    const digest = Number.parseInt(createHash("sha256").update(encoded).digest("hex").slice(0, 12), 16);
    const served = await w.db.pool.query("SELECT value FROM train_metrics WHERE run_id = $1 AND key = 'batch_digest48' AND step = 0", [runId]);
    expect(served.rows[0]?.value).toBe(digest);
  });
});
