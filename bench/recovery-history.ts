/**
 * A long run's history, written in bulk (bench/recovery.ts --samples 1000000): the
 * decisions and facts a sync run with these settings writes for `steps` whole
 * steps (drawn, dispatched, kept, sealed, trained, synced), so that the real
 * controller then continues the run from step `steps` as if it had run them.
 * Decisions go through COPY (their fence trigger still checks every row);
 * the per-sample facts (segments, rounds, rewards, rollout_history) are made
 * by Postgres itself with generate_series, which is faster than sending them.
 *
 * What it leaves out: a real run's varied lengths and rewards (every sample
 * here is 16 tokens, reward 1) and aborted or filtered groups.
 */
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { pipeline } from "node:stream/promises";
import { Readable } from "node:stream";
import { from as copyFrom } from "pg-copy-streams";
import type { Db } from "../src/store/db.ts";
import { loadDecisionsAfter } from "../src/store/decision-log.ts";
import { fold } from "../src/core/run-state.ts";
import type { Decision } from "../src/core/decisions.ts";
import { planDraw } from "../src/controller/draw.ts";
import { loadRunDataset } from "../src/runtime/plugins-registry.ts";
import { createByteTokenizer } from "../src/data/tokenizer.ts";

const copyText = (v: string) => v.replace(/\\/g, "\\\\").replace(/\t/g, "\\t").replace(/\n/g, "\\n").replace(/\r/g, "\\r");

export async function writeHistory(db: Db, runId: string, steps: number, home: string): Promise<{ decisions: number; samples: number }> {
  const state = fold(runId, await loadDecisionsAfter(db, runId, -1));
  const c = state.config;
  if (c.train_async || state.step !== 0 || state.phase !== "collect") throw new Error("writeHistory: a fresh sync run only");
  const B = c.rollout_batch_size;
  const n = c.n_samples_per_prompt;
  if (c.tokenizer !== "bytes") throw new Error("writeHistory: a run on the byte tokenizer (the fake engine's) only");
  const tokenizer = createByteTokenizer();
  const { dataset } = await loadRunDataset(c, tokenizer);
  // A checkpoint the fake trainer can read back as the next step's weights (64 float64).
  const ckptDir = join(home, "history-checkpoint");
  mkdirSync(ckptDir, { recursive: true });
  writeFileSync(join(ckptDir, "weights.safetensors"), Buffer.alloc(64 * 8));
  const uri = pathToFileURL(ckptDir).href;
  const epoch = (await db.pool.query<{ epoch: number }>("SELECT epoch FROM run_leases WHERE run_id = $1", [runId])).rows[0]?.epoch ?? 0;

  const decisions: string[] = [];
  const prompts: string[] = [];
  let seq = state.seq;
  const push = (d: Decision, step: number | null, groupId: number | null) => {
    seq++;
    decisions.push([runId, seq, epoch, d.kind, step ?? "\\N", groupId ?? "\\N", copyText(JSON.stringify(d.payload))].join("\t") + "\n");
  };
  for (let s = 0; s < steps; s++) {
    push({ kind: "step.started", payload: { step: s, weightVersion: s } }, s, null);
    const plan = await planDraw({ dataset, tokenizer, bufferFilter: async () => [] }, state, B, s);
    state.cursor = plan.cursor;
    push({ kind: "prompts.drawn", payload: { step: s, fromBuffer: [], fresh: plan.draws, cursor: plan.cursor } }, s, null);
    for (const r of plan.rows) {
      prompts.push(
        [
          runId,
          r.drawOrdinal,
          r.epoch,
          r.datasetIndex,
          s,
          copyText(r.prompt),
          r.label === null ? "\\N" : copyText(r.label),
          copyText(JSON.stringify(r.metadata)),
          `{${r.promptTokens.join(",")}}`,
        ].join("\t") + "\n",
      );
    }
    for (const d of plan.draws) push({ kind: "group.dispatched", payload: { groupId: d.groupId, round: 0, step: s, weightVersion: s } }, s, d.groupId);
    for (const d of plan.draws) push({ kind: "group.outcome", payload: { groupId: d.groupId, step: s, outcome: "kept", reason: null } }, s, d.groupId);
    push({ kind: "step.sealed", payload: { step: s, kept: plan.draws.map((d) => d.groupId), aborted: [] } }, s, null);
    push({ kind: "train.dispatched", payload: { step: s, weightVersionIn: s } }, s, null);
    push({ kind: "step.trained", payload: { step: s, weightVersionOut: s + 1, checkpointUri: uri } }, s, null);
    push({ kind: "weights.synced", payload: { step: s, weightVersion: s + 1, checkpointUri: uri } }, s, null);
  }
  const client = await db.pool.connect();
  try {
    await client.query("BEGIN");
    const copy = async (sql: string, lines: string[]) => {
      const chunks: string[] = [];
      for (let i = 0; i < lines.length; i += 2000) chunks.push(lines.slice(i, i + 2000).join(""));
      await pipeline(Readable.from(chunks), client.query(copyFrom(sql)));
    };
    await copy("COPY decisions (run_id, seq, lease_epoch, kind, step, group_id, payload) FROM STDIN", decisions);
    await copy("COPY drawn_prompts (run_id, draw_ordinal, epoch, dataset_index, step, prompt, label, metadata, prompt_tokens) FROM STDIN", prompts);
    const groups = steps * B;
    // Per sample: one 16-token segment, one reward, one rollout_history row; per group one round.
    const p = [runId, groups, n, B];
    await client.query(
      `INSERT INTO group_rounds (run_id, group_id, round, step, job_id, is_complete, was_aborted)
       SELECT $1, g, 0, g / $3, 'gen-' || $1 || '-' || g || '-0', true, false FROM generate_series(0, $2::bigint - 1) g`,
      [runId, groups, B],
    );
    await client.query(
      `INSERT INTO sample_segments (run_id, group_id, sample_index, segment_index, round, step, job_id, weight_version, expected_weight_version,
                                    is_version_mismatch, token_start, token_end, tokens, log_probs, loss_mask, engine, finish_reason, status)
       SELECT $1, g, i, 0, 0, g / $4, 'gen-' || $1 || '-' || g || '-0', (g / $4)::int, (g / $4)::int, false, 0, 16,
              array_fill(97, ARRAY[16]), array_fill(-0.5::real, ARRAY[16]), array_fill(1::smallint, ARRAY[16]), 'history', 'stop', 'completed'
         FROM generate_series(0, $2::bigint - 1) g, generate_series(0, $3 - 1) i`,
      p,
    );
    await client.query(
      `INSERT INTO sample_rewards (run_id, group_id, sample_index, round, step, job_id, reward, components)
       SELECT $1, g, i, 0, g / $4, 'rm-' || $1 || '-' || g || '-0', 1, '{}'::jsonb
         FROM generate_series(0, $2::bigint - 1) g, generate_series(0, $3 - 1) i`,
      p,
    );
    await client.query(
      `INSERT INTO rollout_history (run_id, step, group_id, sample_index, draw_ordinal, prompt, response, tokens, prompt_length, response_length,
                                    loss_mask, rollout_log_probs, token_versions, weight_versions, num_segments, status, finish_reason,
                                    reward, reward_components, kept, outcome, outcome_reason, trained_step)
       SELECT $1, d.step, d.draw_ordinal, i, d.draw_ordinal, d.prompt, repeat('a', 16), d.prompt_tokens || array_fill(97, ARRAY[16]),
              cardinality(d.prompt_tokens), 16, array_fill(1::smallint, ARRAY[16]), array_fill(-0.5::real, ARRAY[16]),
              array_fill(d.step, ARRAY[16]), ARRAY[d.step], 1, 'completed', 'stop', 1, '{}'::jsonb, true, 'kept', NULL, d.step
         FROM drawn_prompts d, generate_series(0, $3 - 1) i
        WHERE d.run_id = $1 AND d.draw_ordinal < $2`,
      p.slice(0, 3),
    );
    await client.query(
      `INSERT INTO train_steps (run_id, step, attempt, weight_version_in, weight_version_out, num_samples, num_tokens, checkpoint_uri, checkpoint_sha256)
       SELECT $1, s, 'history', s, s + 1, $3::int * $4::int, $3::int * $4::int * 16, $5, repeat('0', 64) FROM generate_series(0, $2 - 1) s`,
      [runId, steps, n, B, uri],
    );
    await client.query("UPDATE runs SET last_seq = $2, weight_version = $3, step = $3, updated_at = now() WHERE id = $1", [runId, seq, steps]);
    await client.query("COMMIT");
  } catch (e) {
    await client.query("ROLLBACK");
    throw e;
  } finally {
    client.release();
  }
  await db.pool.query("ANALYZE decisions, drawn_prompts, group_rounds, sample_segments, sample_rewards, rollout_history");
  return { decisions: decisions.length, samples: steps * B * n };
}
