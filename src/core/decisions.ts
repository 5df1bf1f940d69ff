/**
 * The decision log's vocabulary. Decisions are past tense (what the
 * controller decided); each is validated when read back. `fold` in
 * run-state.ts turns the ordered list into the run's state, so a restarted
 * controller and `rlq replay` arrive at the same state.
 */

import { RlqError } from "../lib/errors.ts";
import { z } from "zod";

const cursorSchema = z.object({ epoch: z.number().int(), offset: z.number().int(), nextOrdinal: z.number().int() });
export type Cursor = z.infer<typeof cursorSchema>;

/** The GPU memory an engine releases and resumes by tag, in colocated mode (SGLang constants.py GPU_MEMORY_TYPE_*; vLLM wake_up tags). */
export const memoryTags = ["weights", "kv_cache"] as const;
export type MemoryTag = (typeof memoryTags)[number];

export const decisionSchemas = {
  "run.created": z.object({
    config: z.record(z.string(), z.unknown()),
    datasetFingerprint: z.string(),
    datasetSize: z.number().int(),
    datasetErrors: z.array(z.string()),
    pluginFingerprints: z.record(z.string(), z.string()),
    name: z.string(),
  }),
  "run.status": z.object({
    status: z.enum(["running", "paused", "cancelled", "completed"]),
    reason: z.string().nullable(),
  }),
  "run.amended": z.object({ changes: z.record(z.string(), z.unknown()) }),
  "step.started": z.object({ step: z.number().int(), weightVersion: z.number().int() }),
  /** Groups handed out for a step: buffered ones first (through the buffer filter), then fresh draws. */
  "prompts.drawn": z.object({
    step: z.number().int(),
    fromBuffer: z.array(z.number().int()),
    fresh: z.array(z.object({ groupId: z.number().int(), epoch: z.number().int(), datasetIndex: z.number().int() })),
    cursor: cursorSchema,
  }),
  "group.dispatched": z.object({
    groupId: z.number().int(),
    round: z.number().int(),
    step: z.number().int(),
    weightVersion: z.number().int(),
  }),
  /** The dynamic filter's verdict on a completed group round, with its reason. */
  "group.filtered": z.object({
    groupId: z.number().int(),
    round: z.number().int(),
    step: z.number().int(),
    keep: z.boolean(),
    reason: z.string().nullable(),
  }),
  "group.outcome": z.object({
    groupId: z.number().int(),
    step: z.number().int(),
    outcome: z.enum(["kept", "filtered", "buffered", "discarded"]),
    reason: z.string().nullable(),
  }),
  /**
   * staleness_policy drop: these samples' segments before `round` no longer
   * count (they were too stale); the group regenerates them from the prompt in
   * `round` (dispatched with it).
   */
  "group.cut": z.object({
    groupId: z.number().int(),
    step: z.number().int(),
    round: z.number().int(),
    samples: z.array(z.number().int()),
    reason: z.string(),
  }),
  /** Async mode: this in-flight round is aborted before the engines load new weights; it resumes as a new round. */
  "group.aborted": z.object({ groupId: z.number().int(), round: z.number().int(), step: z.number().int(), reason: z.string() }),
  /** The step's batch: kept group ids in training order, and the in-flight rounds being aborted. */
  "step.sealed": z.object({
    step: z.number().int(),
    kept: z.array(z.number().int()),
    aborted: z.array(z.object({ groupId: z.number().int(), round: z.number().int() })),
  }),
  "train.dispatched": z.object({ step: z.number().int(), weightVersionIn: z.number().int() }),
  "step.trained": z.object({
    step: z.number().int(),
    weightVersionOut: z.number().int(),
    checkpointUri: z.string(),
  }),
  /**
   * Async mode: the engines are to load `weightVersion` (trained by `step`); in-flight
   * rounds were aborted (group.aborted), are drained first, or go on across the load (in_place), per weight_update_mode.
   */
  "weights.syncing": z.object({ step: z.number().int(), weightVersion: z.number().int(), mode: z.enum(["abort", "drain", "in_place"]) }),
  /** Evaluate the eval datasets at one pinned version (the step boundary it belongs to). */
  "eval.dispatched": z.object({ step: z.number().int(), weightVersion: z.number().int() }),
  "eval.recorded": z.object({ step: z.number().int() }),
  "weights.synced": z.object({ step: z.number().int(), weightVersion: z.number().int(), checkpointUri: z.string() }),
  /**
   * Colocated mode (core/colocate.ts): every engine released its weights and KV cache after the
   * step's rollout drained; the trainer's turn on the shared GPUs.
   */
  "engines.released": z.object({ step: z.number().int() }),
  /** Colocated mode: every engine resumed `tag` (weights before the trained version loads, kv_cache after). */
  "engines.resumed": z.object({ step: z.number().int(), tag: z.enum(memoryTags) }),
  /**
   * rollout_function_path: ctx call #ordinal of the step's rollout function, recorded in the same
   * transaction as its effect (prompts.drawn, group.dispatched, group.outcome buffered). A
   * restarted controller replays the function against these (src/controller/rollout-journal.ts):
   * `op` + `key` (the canonical arguments) must match, and the result comes from here and the facts.
   */
  "rollout_fn.called": z.object({
    step: z.number().int(),
    ordinal: z.number().int().nonnegative(),
    op: z.enum(["draw", "generate", "filter_dynamic", "add_to_buffer"]),
    key: z.string(),
    /** draw: the groups handed out, buffer first; generate / filter_dynamic: [group]; add_to_buffer: the groups. */
    groupIds: z.array(z.number().int()),
    /** draw: how many of groupIds came from the buffer. */
    bufferCount: z.number().int().nonnegative().default(0),
    /** generate: the first round dispatched; filter_dynamic: the round judged. */
    round: z.number().int().nullable().default(null),
    /** filter_dynamic: the run's dynamic filter verdict (the plugin is not called again on replay). */
    verdict: z.object({ keep: z.boolean(), reason: z.string().nullable(), keep_when_insufficient: z.boolean() }).nullable().default(null),
  }),
} as const;

export type DecisionKind = keyof typeof decisionSchemas;
export type DecisionPayload<K extends DecisionKind> = z.infer<(typeof decisionSchemas)[K]>;

export type Decision = {
  [K in DecisionKind]: { kind: K; payload: DecisionPayload<K> };
}[DecisionKind];

/** A decision as stored: with its sequence number. */
export type LoggedDecision = Decision & { seq: number };

export function parseDecision(kind: string, payload: unknown, seq: number): LoggedDecision {
  if (!(kind in decisionSchemas)) throw new RlqError("decision_log_corrupt", `decision ${seq}: unknown kind '${kind}'`);
  const schema = decisionSchemas[kind as DecisionKind];
  const parsed = schema.safeParse(payload);
  if (!parsed.success) throw new RlqError("decision_log_corrupt", `decision ${seq} (${kind}): ${parsed.error.message}`);
  return { kind, payload: parsed.data, seq } as LoggedDecision;
}

/** Columns the store indexes decisions by (step, group) for lookups by workers and views. */
export function decisionKeys(d: Decision): { step: number | null; groupId: number | null } {
  const p = d.payload as { step?: number; groupId?: number };
  return { step: p.step ?? null, groupId: p.groupId ?? null };
}
