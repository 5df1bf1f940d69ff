/**
 * `rollout_function_path`: slime's `generate_rollout(args, rollout_id,
 * data_source, evaluation=False)` as a TS/JS module function
 * `rollout(args, ctx)` (docs/plugins.md). The train branch runs in the
 * controller as a replayed planner (src/controller/rollout-function.ts), the
 * eval branch inside the eval job (src/jobs/rollout-function-eval.ts).
 * What the function gets and must return is defined here.
 */

import { z } from "zod";
import type { RunConfig } from "../config/run-config.ts";
import type { SampleStatus } from "../core/sample.ts";
import type { DynamicFilterOutput } from "../filters/index.ts";
import { isHttpPluginPath } from "../plugins/http.ts";
import { loadPluginFunction, parsePluginPath } from "../plugins/load.ts";
import { RlqError } from "../lib/errors.ts";

/** A group handed out by `ctx.draw`: one prompt, to be generated n_samples_per_prompt times. */
export interface RolloutGroup {
  /** The group id, which is also its draw ordinal (`drawn_prompts.draw_ordinal`). */
  readonly groupId: number;
  readonly prompt: string;
  readonly label: string | null;
  readonly metadata: unknown;
  /** The group came back from the partial-rollout buffer (it may hold partial samples). */
  readonly isFromBuffer: boolean;
}

/** One sample of a generated group, as recorded (frozen: rlq trains on the facts, not on this object). */
export interface RolloutSample {
  readonly groupId: number;
  readonly sampleIndex: number;
  /** The rollout round (job) that finished the group. */
  readonly round: number;
  readonly prompt: string;
  readonly label: string | null;
  readonly metadata: unknown;
  readonly response: string;
  readonly responseTokens: readonly number[];
  readonly status: SampleStatus;
  readonly finishReason: string;
  /** The trained-on reward (after reward_key), from the reward job. */
  readonly reward: number;
  readonly rewardComponents: Readonly<Record<string, unknown>>;
  /** Weight versions of the sample's segments, oldest first. */
  readonly weightVersions: readonly number[];
}

/** `ctx` of the train branch. Every call is recorded and replayed (keyed by its ordinal in the step). */
export interface RolloutTrainContext {
  readonly evaluation: false;
  /** slime's rollout_id: the step. */
  readonly rolloutId: number;
  /** n groups: buffer first (through buffer_filter_path), then the dataset cursor. Recorded as prompts.drawn. */
  draw(n: number): Promise<readonly RolloutGroup[]>;
  /** One rollout job per round until the group is finished and scored (custom generate, aborts and rewards as usual). */
  generate(group: RolloutGroup | readonly RolloutSample[]): Promise<readonly RolloutSample[]>;
  /** The rewards of a generated group (the reward job's). */
  score(group: readonly RolloutSample[]): Promise<readonly number[]>;
  /** The run's dynamic_sampling_filter_path verdict on a generated group (recorded; the plugin is not called again on replay). */
  filterDynamic(group: readonly RolloutSample[]): Promise<Readonly<DynamicFilterOutput>>;
  /** Put groups (drawn or generated) back in the partial-rollout buffer: the next draws serve them first. */
  addToBuffer(groups: ReadonlyArray<RolloutGroup | readonly RolloutSample[]>): Promise<void>;
}

/** A prompt of an eval dataset. */
export interface EvalPrompt {
  readonly dataset: string;
  /** Index among the dataset's valid rows. */
  readonly index: number;
  readonly prompt: string;
  readonly label: string | null;
  readonly metadata: Readonly<Record<string, unknown>>;
}

export interface EvalSample {
  readonly dataset: string;
  readonly promptIndex: number;
  readonly sampleIndex: number;
  readonly prompt: string;
  readonly label: string | null;
  readonly metadata: Readonly<Record<string, unknown>>;
  readonly response: string;
  readonly responseTokens: readonly number[];
  readonly finishReason: "stop" | "length" | "abort";
  readonly status: "completed" | "truncated";
  readonly weightVersion: number;
}

/** `ctx` of the eval branch (inside the eval job: it runs again as a whole if the job is retried). */
export interface RolloutEvalContext {
  readonly evaluation: true;
  /** The step boundary the eval belongs to. */
  readonly rolloutId: number;
  readonly datasets: Readonly<Record<string, readonly EvalPrompt[]>>;
  /** `n` (default n_samples_per_eval_prompt) samples of one prompt with the eval_* sampling settings. */
  generate(prompt: EvalPrompt, options?: { n?: number }): Promise<readonly EvalSample[]>;
  /** The run's reward of each sample, in order. */
  score(samples: readonly EvalSample[]): Promise<readonly number[]>;
}

export type RolloutFunction = (args: RunConfig, ctx: RolloutTrainContext | RolloutEvalContext) => unknown;

/** Default export names, in lookup order (then `default`). */
export const ROLLOUT_FUNCTION_EXPORTS = ["rollout", "generateRollout", "generate_rollout"] as const;

/** A returned sample is matched to the recorded one by (groupId, sampleIndex); reward and response, if present, must be unchanged. */
const sampleRefSchema = z.looseObject({
  groupId: z.number().int(),
  sampleIndex: z.number().int(),
  reward: z.number().optional(),
  response: z.string().optional(),
});

const metricsSchema = z.record(z.string(), z.number());

/** slime's RolloutFnTrainOutput, or a bare list of groups (slime's call_rollout_fn wraps a legacy return). */
export const trainOutputSchema = z.union([
  z.strictObject({ samples: z.array(z.array(sampleRefSchema)), metrics: metricsSchema.optional() }),
  z.array(z.array(sampleRefSchema)).transform((samples) => ({ samples, metrics: undefined })),
]);

/** slime's RolloutFnEvalOutput: per dataset the rewards, truncation flags and samples, index-aligned. */
export const evalOutputSchema = z.strictObject({
  data: z.record(
    z.string(),
    z.strictObject({
      rewards: z.array(z.number().finite()),
      truncated: z.array(z.boolean()),
      samples: z.array(z.looseObject({ dataset: z.string(), promptIndex: z.number().int(), sampleIndex: z.number().int() })),
    }),
  ),
  metrics: metricsSchema.optional(),
});

/** `path (step N) returned ...` errors: non-retriable, they pause the run with this message. */
export function badReturn(path: string, step: number, evaluation: boolean, detail: string): RlqError {
  return new RlqError("plugin_bad_return", `rollout_function_path ${path} (${evaluation ? "eval" : "step"} ${step}) returned ${detail}`);
}

export function zodDetail(error: z.ZodError): string {
  return error.issues
    .slice(0, 4)
    .map((i) => `${i.path.join(".") || "(value)"}: ${i.message}`)
    .join("; ");
}

/** Load the module function. HTTP is refused by the config already; refused here too for configs stored before that check. */
export async function loadRolloutFunction(path: string, baseDir: string): Promise<RolloutFunction> {
  if (isHttpPluginPath(path)) {
    throw new RlqError(
      "config_invalid",
      `rollout_function_path ${path}: HTTP rollout functions are not supported; name a TS/JS module (path/to/file.ts:exportName)`,
    );
  }
  return loadPluginFunction<RolloutFunction>(parsePluginPath(path, baseDir), ROLLOUT_FUNCTION_EXPORTS, "rollout_function_path");
}

/** Deep-freeze a value handed to the function: an edit throws (ES modules are strict) instead of being silently ignored. */
export function deepFreeze<T>(value: T): T {
  if (value !== null && typeof value === "object" && !Object.isFrozen(value)) {
    Object.freeze(value);
    for (const v of Object.values(value as Record<string, unknown>)) deepFreeze(v);
  }
  return value;
}
