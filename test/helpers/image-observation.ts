import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { expect } from "vitest";
import { visionChatTokenizerDir } from "./chat-tokenizer.ts";
import { solidPng } from "./png.ts";
import { fakeStats } from "../fakes/fake-engine-control.ts";
import { sha256Hex } from "../../src/lib/hash.ts";
import { loadTrainBatch } from "../../src/jobs/train-batch.ts";
import { decodeBatch, encodeBatch } from "../../src/trainer/batch-codec.ts";
import { loadRunRow } from "../../src/store/run-facts.ts";
import { decodeRecordedConfig } from "../../src/config/recorded-config.ts";
import type { Db } from "../../src/store/db.ts";
import type { RunContext } from "../../src/runtime/run-context.ts";

/**
 * @file The world of the image-observation tests (image-observation-run.test.ts, a JavaScript
 * agent; python-image-observation.test.ts, a slime Python one): red prompt images, one step of 2
 * groups of 2 samples on the fake SGLang, and the read-backs both check (the history's segments, the
 * images the engine saw per request, the train batch as served). Both agents answer one model turn,
 * an observation and a second turn, so what the engine and the batch must hold is the same.
 */

/** The prompt image every row names (as `red.png`, beside the data file). */
export const RED_PNG = solidPng([255, 0, 0]);

/** Writes `red.png` and `d.jsonl` (`rows` prompts, each naming red.png) under `dir`; returns the data file. */
export function writeRedImagePrompts(dir: string, rows: number): string {
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "red.png"), RED_PNG);
  const lines = Array.from({ length: rows }, (_, i) => JSON.stringify({ input: `Q${i}: what colour?`, label: "green", images: ["red.png"] }));
  writeFileSync(join(dir, "d.jsonl"), lines.join("\n"));
  return join(dir, "d.jsonl");
}

/**
 * The run-config keys both tests share: the vision chat template (its image placeholder is what an
 * observation's tokens hold), one step of 2 prompts x 2 samples with no over-sampling or filter (so
 * every sample trains and the batch holds 4), and room for two 4-token turns and the observation.
 */
export function imageObservationConfig(promptData: string, customGenerateFunctionPath: string) {
  return {
    prompt_data: promptData,
    multimodal_keys: { image: "images" },
    apply_chat_template: true,
    hf_checkpoint: visionChatTokenizerDir(),
    custom_generate_function_path: customGenerateFunctionPath,
    num_rollout: 1,
    rollout_batch_size: 2,
    n_samples_per_prompt: 2,
    over_sampling_batch_size: null,
    dynamic_sampling_filter_path: null,
    rollout_max_response_len: 128,
  };
}

export interface SegmentRow {
  group_id: string;
  sample_index: number;
  segment_index: number;
  images: Array<Record<string, unknown>> | null;
  loss_mask: number[];
}

/** The run's history segments by sample (`group-sample`), each sample's in segment order. */
export async function segmentsBySample(db: Db, runId: string): Promise<Map<string, SegmentRow[]>> {
  const segs = await db.pool.query<SegmentRow>(
    "SELECT group_id, sample_index, segment_index, images, loss_mask FROM sample_segments WHERE run_id = $1 ORDER BY group_id, sample_index, segment_index",
    [runId],
  );
  const samples = new Map<string, SegmentRow[]>();
  for (const r of segs.rows) samples.set(`${r.group_id}-${r.sample_index}`, [...(samples.get(`${r.group_id}-${r.sample_index}`) ?? []), r]);
  return samples;
}

/**
 * The image hashes the fake SGLang saw on the request of one segment: its rid is
 * `run-group-sample-segment`, followed on the server by the pool's attempt suffix (`.aN.`,
 * src/engines/pool-requests.ts `serverRid`).
 */
export async function engineImagesBySegment(engineUrl: string, runId: string): Promise<(g: string, s: number, segment: number) => string[] | undefined> {
  const seen = (await fakeStats(engineUrl)).imagesSeen;
  return (g, s, segment) =>
    Object.entries(seen).find(([rid]) => rid.startsWith(`${runId}-${g}-${s}-${segment}.`) || rid === `${runId}-${g}-${s}-${segment}`)?.[1];
}

/**
 * The step's batch as served to the trainer: every sample of its 4 carries the images `shas` in
 * order, bytes included after an encode/decode round trip. Returns the encoded batch, for a test
 * that checks the digest the trainer reports.
 */
export async function expectBatchImages(db: Db, runId: string, shas: readonly string[]): Promise<Uint8Array> {
  const ctx = { runId, config: decodeRecordedConfig((await loadRunRow(db, runId))?.config, `run ${runId} config`) } as RunContext;
  const { batch } = await loadTrainBatch(db, ctx, 0);
  expect(batch.samples).toHaveLength(4);
  for (const s of batch.samples) expect(s.images?.map((i) => i.sha256)).toEqual(shas);
  const encoded = encodeBatch({ ...batch, runId: "" });
  for (const s of decodeBatch(encoded).samples) expect(s.images?.map((i) => sha256Hex(i.bytes as Uint8Array))).toEqual(shas);
  return encoded;
}
