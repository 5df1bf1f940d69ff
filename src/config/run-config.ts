/**
 * The run config: one YAML or JSON file, slime's flag names in snake_case
 * (slime/utils/arguments.py at THUDM/slime 624b824), validated here. A run
 * stores the validated result; workers read it from the run, never from disk.
 * Defaults follow slime unless a comment says otherwise.
 */

import { z } from "zod";
import { opdKeys } from "./opd.ts";
import { refineLora, trainerTorchKeys, trainerTorchLoraKeys, trainerTorchParallelKeys } from "./trainer-torch-keys.ts";
import { evalDatasetEntrySchema, resolveEvalDatasets } from "./eval-datasets.ts";
import { refineSft, sftKeys } from "./sft-keys.ts";
import { debugKeys, refineDebug } from "./debug-keys.ts";
import { colocateKeys, refineColocate } from "./colocate-keys.ts";
import { algorithmOptionsShape, refineAlgorithmOptions } from "../algorithms/options.ts";
import { engineRuntimeKeys, openAiEngineConfigSchema, sglangEngineConfigSchema } from "../engines/config-schema.ts";
import { remoteTrainerConfigSchema } from "../trainer/remote-trainer-config.ts";
import { secretRefSchema } from "./secrets.ts";
import { normalizeSlimeForms, parsedConfigIssues, rawConfigIssues, unknownKeyAdvice } from "./slime-traps.ts";
import { metricExportKeys, refineMetricExport } from "../observability/metrics-export/config.ts";
import { redact } from "../lib/redact.ts";
import { RlqError } from "../lib/errors.ts";
import { renamedKeyAdvice } from "./config-versions.ts";

const engineSchema = z.discriminatedUnion("kind", [
  z
    .object({
      kind: z.literal("embedded"),
      /**
       * Testing/research knob: std of Gaussian noise the ONNX engine adds to the logits
       * before sampling and before its reported log-probs, an injected train/rollout
       * mismatch for seeing TIS/MIS work (docs/embedded-model.md). 0 = off.
       */
      logit_noise_std: z.number().nonnegative().default(0),
    })
    .strict(),
  sglangEngineConfigSchema,
  openAiEngineConfigSchema,
]);

const trainerSchema = z.discriminatedUnion("kind", [z.object({ kind: z.literal("embedded") }).strict(), remoteTrainerConfigSchema]);

const pathOrNull = z.string().min(1).nullable().default(null);

export const runConfigSchema = z
  .object({
    // data
    prompt_data: z.string().min(1),
    input_key: z.string().default("input"),
    label_key: z.string().nullable().default("label"),
    metadata_key: z.string().default("metadata"),
    tool_key: z.string().default("tools"),
    apply_chat_template: z.boolean().default(false),
    apply_chat_template_kwargs: z.record(z.string(), z.unknown()).default({}),
    /** rlq: a bad dataset row is reported and skipped (skip) or fails the run start (fail). */
    bad_row_policy: z.enum(["skip", "fail"]).default("skip"),
    rollout_max_prompt_len: z.number().int().positive().nullable().default(null),
    /**
     * slime --multimodal-keys: media type → dataset key holding the row's images (`{image: images}`);
     * needs apply_chat_template. Images: paths relative to the dataset, data URIs, bytes (src/data/images.ts).
     */
    multimodal_keys: z
      .record(z.string(), z.string().min(1))
      .refine((m) => Object.keys(m).every((t) => t === "image"), {
        error: "the only media type rlq reads is image: write {image: <dataset key>} (video and audio are not read)",
      })
      .nullable()
      .default(null),
    /**
     * bytes: UTF-8 bytes + BOS/EOS (what the test engines speak); model: the embedded model's tokenizer;
     * hf: hf_checkpoint's. Left out with a remote engine: hf when hf_checkpoint is set, else refused
     * (config/slime-traps.ts).
     */
    tokenizer: z.enum(["bytes", "model", "hf"]).default("bytes"),
    // batch
    rollout_batch_size: z.number().int().positive(),
    n_samples_per_prompt: z.number().int().positive().default(1),
    over_sampling_batch_size: z.number().int().positive().nullable().default(null),
    num_rollout: z.number().int().positive().nullable().default(null),
    num_epoch: z.number().int().positive().nullable().default(null),
    global_batch_size: z.number().int().positive().nullable().default(null),
    num_steps_per_rollout: z.number().int().positive().default(1),
    // sampling
    rollout_max_response_len: z.number().int().positive(),
    rollout_max_context_len: z.number().int().positive().nullable().default(null),
    rollout_temperature: z.number().positive().default(1.0),
    rollout_top_p: z.number().gt(0).max(1).default(1.0),
    rollout_top_k: z.number().int().default(-1),
    rollout_stop_token_ids: z.array(z.number().int().nonnegative()).default([]),
    rollout_shuffle: z.boolean().default(false),
    rollout_seed: z.number().int().nonnegative().default(42),
    // partial rollouts and filters
    partial_rollout: z.boolean().default(false),
    /**
     * rlq: early group completion (core/early-completion.ts). A group's first round draws
     * n_samples_per_prompt + this many samples and completes with the first n_samples_per_prompt that
     * finish; the others are aborted and dropped, so a group does not wait on its slowest sample.
     * It favours shorter responses (the dropped ones are the slowest); 0 (default): off.
     */
    group_extra_samples: z.number().int().nonnegative().default(0),
    mask_offpolicy_in_partial_rollout: z.boolean().default(false),
    dynamic_sampling_filter_path: pathOrNull,
    buffer_filter_path: pathOrNull,
    // reward (reward_key is in the algorithm options)
    rm_type: z.string().nullable().default(null),
    custom_rm_path: pathOrNull,
    rm_url: z.string().url().nullable().default(null),
    /** rlq: bearer token for rm_url (`{env: NAME}` or `{file: PATH}`, read by the process that calls it). */
    rm_api_key: secretRefSchema.nullable().default(null),
    /** rlq: bearer token for every http:// plugin path (custom_rm_path, filters, custom_generate_function_path). */
    plugin_api_key: secretRefSchema.nullable().default(null),
    group_rm: z.boolean().default(false),
    custom_generate_function_path: pathOrNull,
    /**
     * slime's --rollout-function-path (generate_rollout): a TS/JS module function
     * `rollout(args, ctx)` that plans each sync step's collect phase and the evals
     * (docs/plugins.md). Module paths only (`path/to/file.ts:exportName`).
     */
    rollout_function_path: pathOrNull,
    // algorithm: every option of src/algorithms (docs/algorithms.md), slime's names and defaults
    ...algorithmOptionsShape,
    // optimizer (embedded and remote trainers)
    lr: z.number().positive().default(1e-6),
    lr_decay_style: z.enum(["constant", "linear", "cosine"]).default("constant"),
    lr_warmup_iters: z.number().int().nonnegative().default(0),
    lr_decay_iters: z.number().int().positive().nullable().default(null),
    min_lr: z.number().nonnegative().default(0),
    adam_beta1: z.number().min(0).lt(1).default(0.9),
    adam_beta2: z.number().min(0).lt(1).default(0.999),
    adam_eps: z.number().positive().default(1e-8),
    max_tokens_per_gpu: z.number().int().positive().nullable().default(null),
    // trainer-torch (docs/trainer-torch.md): packing, the PPO critic, memory and output options
    ...trainerTorchKeys,
    ...trainerTorchParallelKeys,
    // SFT as a run mode (config/sft-keys.ts, docs/sft.md)
    ...sftKeys,
    ...trainerTorchLoraKeys,
    // slime's debug replay: train only on a recorded run, or roll out only (config/debug-keys.ts, docs/observability.md)
    ...debugKeys,
    ...colocateKeys,
    /** Remote trainers: a local Hugging Face model directory (workers/trainer-torch). */
    hf_checkpoint: z.string().nullable().default(null),
    weight_decay: z.number().nonnegative().default(0),
    clip_grad: z.number().positive().default(1.0),
    seed: z.number().int().nonnegative().default(1234),
    /** Initial checkpoint (slime: --load falls back to --ref-load). Null: initialise from `seed`. */
    ref_load: pathOrNull,
    loss_mask_type: z.enum(["qwen", "qwen3", "qwen3_5", "distill_qwen"]).default("qwen"),
    update_weights_interval: z.number().int().positive().default(1),
    // eval and save (slime: eval_* fall back to the rollout_* values)
    eval_interval: z.number().int().positive().nullable().default(null),
    /**
     * Named eval datasets, {name: path} (slime: --eval-prompt-data name path ...), or {name: {path, ...overrides}}
     * (slime's --eval-config datasets; config/eval-datasets.ts).
     */
    eval_prompt_data: z
      .record(z.string().regex(/^[A-Za-z0-9_.-]+$/, "dataset names: letters, digits, _ . -"), evalDatasetEntrySchema)
      .nullable()
      .default(null),
    eval_tool_key: z.string().min(1).nullable().default(null),
    /** slime --eval-max-prompt-len: eval prompts longer than this many tokens are left out (null: none). */
    eval_max_prompt_len: z.number().int().positive().nullable().default(null),
    /** slime --eval-apply-chat-template-kwargs: the chat template's kwargs for evals (null: apply_chat_template_kwargs). */
    eval_apply_chat_template_kwargs: z.record(z.string(), z.unknown()).nullable().default(null),
    n_samples_per_eval_prompt: z.number().int().positive().default(1),
    eval_temperature: z.number().positive().nullable().default(null),
    eval_top_p: z.number().gt(0).max(1).nullable().default(null),
    eval_top_k: z.number().int().nullable().default(null),
    eval_max_response_len: z.number().int().positive().nullable().default(null),
    eval_input_key: z.string().nullable().default(null),
    eval_label_key: z.string().nullable().default(null),
    /** rlq: the k of pass@k reported per eval dataset (k <= n_samples_per_eval_prompt). */
    eval_pass_k: z.array(z.number().int().positive()).default([1]),
    skip_eval_before_train: z.boolean().default(false),
    save_interval: z.number().int().positive().nullable().default(null),
    // rlq
    engine: engineSchema.default({ kind: "embedded", logit_noise_std: 0 }),
    // remote engines: concurrency, health checks and weight sync (docs/engines.md)
    ...engineRuntimeKeys,
    // metric sinks: TensorBoard and W&B (observability/metrics-export/config.ts)
    ...metricExportKeys,
    // on-policy distillation: the teacher engine (config/opd.ts; use_opd and opd_kl_coef are algorithm options)
    ...opdKeys,
    trainer: trainerSchema.default({ kind: "embedded" }),
    /** Where attempt-scoped and committed checkpoints live (relative to RLQ_HOME when relative). */
    checkpoint_dir: z.string().default("checkpoints"),
    /**
     * Deterministic mode: every dispatched group runs to completion (no aborts)
     * and the kept set is the first rollout_batch_size passing groups by draw
     * ordinal, so a restarted run's facts equal an uninterrupted one's.
     */
    deterministic: z.boolean().default(false),
    train_stall_timeout_s: z.number().positive().default(120),
    /** Attempts a train job gets before the run pauses (rollout, reward and eval jobs retry by their own rules). Version-1 configs call it max_attempts (config-versions.ts). */
    train_max_attempts: z.number().int().positive().default(3),
    /**
     * How long a train job waits for a trainer it cannot connect to (a GPU
     * trainer restarting, reloading a model) before the run pauses with that
     * reason. The wait uses no attempt: train_max_attempts counts attempts the
     * trainer took and lost (failed, stalled, or died with the process).
     */
    trainer_unreachable_timeout_s: z.number().positive().default(300),
    /**
     * Asynchronous mode (slime's train_async): generation keeps going while steps
     * train, under admission control (docs/architecture.md "Asynchronous mode"). max_staleness defaults to 1 here
     * (slime's one-step-off pipeline).
     */
    train_async: z.boolean().default(false),
    /** Bound on a trained token's staleness (versions). null = slime's behaviour (no bound). */
    max_staleness: z.number().int().nonnegative().nullable().default(null),
    /** What a token staler than max_staleness gets: loss mask 0, its sample regenerated, or kept. */
    staleness_policy: z.enum(["keep", "mask", "drop"]).default("keep"),
    /** drop: regenerations of one group before it is discarded (reason "stale"). */
    max_regenerations: z.number().int().nonnegative().default(2),
    /**
     * Async mode: before engines load new weights, in-flight requests are aborted (and resume as new
     * segments), drained, or kept in place (each engine pauses keeping them, loads, and continues:
     * core/weight-sync.ts `SyncStrategy`).
     */
    weight_update_mode: z.enum(["abort", "drain", "in_place"]).default("abort"),
    /**
     * rlq: weight_update_mode in_place only. At most this many engines pause and load at once while
     * the others keep decoding their requests at the old version (core/staggered-load.ts); engines
     * still on the old version take no new request, so the per-token staleness bound stays exact.
     * null (default): every engine at once.
     */
    weight_load_max_engines: z.number().int().positive().nullable().default(null),
    // rlq: a learned reward model scored in-process (docs/rewards.md "onnx_rm")
    /** rm_type onnx_rm: the model directory (model.onnx, tokenizer.json, reward_model.json) that scripts/export-reward-model.py writes. */
    rm_model_path: pathOrNull,
  })
  .strict()
  .superRefine((c, ctx) => {
    refineAlgorithmOptions(c, ctx);
    refineLora(c, ctx);
    refineMetricExport(c, ctx);
    refineSft(c, ctx);
    refineDebug(c, ctx);
    refineColocate(c, ctx);
    refineInPlace(c, ctx);
    refineEarlyAndStaggered(c, ctx);
    if (c.weight_sync === "none" && c.train_async) {
      ctx.addIssue({
        code: "custom",
        path: ["weight_sync"],
        message: "weight_sync: none (frozen engine weights) runs in sync mode only: set train_async: false, or use weight_sync: disk with an SGLang engine",
      });
    }
    if (c.weight_sync === "none" && c.max_staleness !== null) {
      ctx.addIssue({
        code: "custom",
        path: ["max_staleness"],
        message: `weight_sync: none keeps the engines at version 0, so step k trains on samples k versions stale and max_staleness: ${c.max_staleness} would refuse them all; leave max_staleness null (use_tis corrects the mismatch)`,
      });
    }
    if (c.eval_interval !== null && c.eval_prompt_data === null) {
      ctx.addIssue({
        code: "custom",
        path: ["eval_prompt_data"],
        message: "eval_interval is set: name the eval datasets, e.g. {gsm8k: data/gsm8k-test.jsonl}",
      });
    }
    for (const d of resolveEvalDatasets(c)) {
      for (const k of c.eval_pass_k) {
        if (k > d.n)
          ctx.addIssue({
            code: "custom",
            path: ["eval_pass_k"],
            message: `pass@${k} needs n_samples_per_eval_prompt >= ${k} (eval dataset ${d.name} has ${d.n})`,
          });
      }
      if (d.applyChatTemplate && !c.apply_chat_template && c.hf_checkpoint === null)
        ctx.addIssue({
          code: "custom",
          path: ["eval_prompt_data", d.name, "apply_chat_template"],
          message: "apply_chat_template needs hf_checkpoint (a local Hugging Face tokenizer directory with a chat template)",
        });
    }
    if (c.eval_prompt_data === null && c.eval_pass_k.some((k) => k > c.n_samples_per_eval_prompt)) {
      ctx.addIssue({
        code: "custom",
        path: ["eval_pass_k"],
        message: `pass@k needs n_samples_per_eval_prompt >= k (got ${c.n_samples_per_eval_prompt})`,
      });
    }
    if (c.staleness_policy !== "keep" && c.max_staleness === null && !c.train_async) {
      ctx.addIssue({
        code: "custom",
        path: ["staleness_policy"],
        message: `staleness_policy ${c.staleness_policy} needs a bound: set max_staleness (versions)`,
      });
    }
    if (c.train_async && c.deterministic) {
      ctx.addIssue({ code: "custom", path: ["deterministic"], message: "deterministic mode needs synchronous steps: it cannot be combined with train_async" });
    }
    if (c.rollout_function_path !== null && /^https?:\/\//i.test(c.rollout_function_path.trim())) {
      ctx.addIssue({
        code: "custom",
        path: ["rollout_function_path"],
        message:
          "HTTP rollout functions are not supported: the controller replays the function on every restart, which needs the code in-process; name a TS/JS module, e.g. plugins/rollout.ts:rollout (an HTTP endpoint can still be called per sample through custom_generate_function_path)",
      });
    }
    if (c.rollout_function_path !== null && c.train_async) {
      ctx.addIssue({
        code: "custom",
        path: ["rollout_function_path"],
        message: "rollout_function_path plans synchronous steps: it cannot be combined with train_async (asynchronous mode)",
      });
    }
    if (c.rm_type?.trim() === "remote_rm" && c.rm_url === null) {
      ctx.addIssue({ code: "custom", path: ["rm_url"], message: "rm_type remote_rm needs rm_url (the reward server's URL)" });
    }
    if (c.apply_chat_template && c.hf_checkpoint === null) {
      ctx.addIssue({
        code: "custom",
        path: ["hf_checkpoint"],
        message: "apply_chat_template needs hf_checkpoint (a local Hugging Face tokenizer directory with a chat template)",
      });
    }
    if (c.tokenizer === "hf" && c.hf_checkpoint === null) {
      ctx.addIssue({
        code: "custom",
        path: ["hf_checkpoint"],
        message: "tokenizer: hf needs hf_checkpoint (a local Hugging Face model or tokenizer directory)",
      });
    }
    if (c.engine.kind === "embedded" && c.ref_load === null) {
      ctx.addIssue({
        code: "custom",
        path: ["ref_load"],
        message: "engine.kind embedded needs a checkpoint to serve: set ref_load (e.g. examples/demo/warm-start)",
      });
    }
    if (c.num_rollout === null && c.num_epoch === null) {
      ctx.addIssue({ code: "custom", path: ["num_rollout"], message: "one of num_rollout or num_epoch is required" });
    }
    if (c.over_sampling_batch_size !== null && c.over_sampling_batch_size < c.rollout_batch_size) {
      ctx.addIssue({
        code: "custom",
        path: ["over_sampling_batch_size"],
        message: `must be >= rollout_batch_size (${c.rollout_batch_size})`,
      });
    }
    if (c.mask_offpolicy_in_partial_rollout && !c.partial_rollout) {
      ctx.addIssue({ code: "custom", path: ["mask_offpolicy_in_partial_rollout"], message: "requires partial_rollout: true" });
    }
    if (c.rm_type === null && c.custom_rm_path === null) {
      ctx.addIssue({ code: "custom", path: ["rm_type"], message: "set rm_type or custom_rm_path" });
    }
    const samples = c.rollout_batch_size * c.n_samples_per_prompt;
    const gbs = c.global_batch_size ?? samples / c.num_steps_per_rollout;
    if (!Number.isInteger(gbs) || samples % gbs !== 0) {
      ctx.addIssue({
        code: "custom",
        path: ["global_batch_size"],
        message: `rollout_batch_size x n_samples_per_prompt (${samples}) must split into whole global batches (got ${gbs})`,
      });
    }
    if (c.rm_type?.trim() === "onnx_rm" && c.rm_model_path === null && c.custom_rm_path === null) {
      ctx.addIssue({
        code: "custom",
        path: ["rm_model_path"],
        message: "rm_type onnx_rm needs rm_model_path (the directory scripts/export-reward-model.py writes)",
      });
    }
  });

export type RunConfigInput = z.input<typeof runConfigSchema>;
export type RunConfig = z.infer<typeof runConfigSchema>;

/** Keys `rlq run amend` may change on a live run, and why each is safe. */
export const amendableKeys = {
  num_rollout: "extends or shortens the run; already committed steps stay",
  eval_interval: "only changes when evals are scheduled",
  save_interval: "only changes when checkpoints are kept",
  train_stall_timeout_s: "only changes fault detection",
  train_max_attempts: "only changes fault handling",
  trainer_unreachable_timeout_s: "only changes fault handling",
} as const;

/** A config a user wrote wrongly (code `config_invalid`, not retriable): the message names the key, the value and what was expected. */
export class ConfigError extends RlqError {
  constructor(message: string) {
    super("config_invalid", message);
    this.name = "ConfigError";
  }
}

/**
 * Validate, naming the key, the value and what was expected. `origin: "user"`
 * (a config as written: run start, rlq config check) adds the checks that need
 * to know which keys were written; a stored config has every default filled in.
 */
export function parseRunConfig(input: unknown, source = "config", origin: "user" | "stored" = "stored"): RunConfig {
  // slime's forms and derived defaults first (config/slime-traps.ts), idempotent on a stored config.
  const raw = normalizeSlimeForms(input);
  const parsed = runConfigSchema.safeParse(raw);
  const written = origin === "user" ? [...rawConfigIssues(raw), ...(parsed.success ? parsedConfigIssues(parsed.data) : [])] : [];
  const writtenIssues = written.map((i) => `${source}: ${i.path} = ${JSON.stringify(lookup(raw, [i.path])) ?? "(missing)"}: ${i.message}`);
  if (parsed.success && writtenIssues.length === 0) return parsed.data;
  const lines = (parsed.success ? [] : parsed.error.issues).map((issue) => {
    const key = issue.path.join(".");
    const value = lookup(raw, issue.path);
    // redact: a secret pasted where a reference belongs (wandb_key) is registered and never echoed.
    const shown = value === undefined ? "(missing)" : redact(JSON.stringify(value));
    if (issue.code === "unrecognized_keys") {
      const advice = issue.path.length === 0 ? topLevelKeyAdvice(issue.keys) : "";
      return `${source}: unknown key(s) ${issue.keys.map((k) => `'${[...issue.path, k].join(".")}'`).join(", ")}${advice ? ` (${advice})` : ""}`;
    }
    return `${source}: ${key || "(root)"} = ${shown}: ${issue.message}`;
  });
  throw new ConfigError([...lines, ...writtenIssues].join("\n"));
}

/** Advice for unknown top-level keys: a key renamed by a config version first, then slime's traps and near misses. */
function topLevelKeyAdvice(keys: readonly string[]): string {
  const renamed = keys.flatMap((k) => {
    const advice = renamedKeyAdvice(k);
    return advice === null ? [] : [`'${k}': ${advice}`];
  });
  const others = keys.filter((k) => renamedKeyAdvice(k) === null);
  return [...renamed, unknownKeyAdvice(others, new Set(Object.keys(runConfigSchema.shape)))].filter((a) => a !== "").join("; ");
}

function lookup(raw: unknown, path: ReadonlyArray<PropertyKey>): unknown {
  let cur: unknown = raw;
  for (const key of path) {
    if (cur === null || typeof cur !== "object") return undefined;
    cur = (cur as Record<PropertyKey, unknown>)[key];
  }
  return cur;
}

/** Effective values slime derives after parsing. */
export function overSamplingBatchSize(c: RunConfig): number {
  return c.over_sampling_batch_size ?? c.rollout_batch_size;
}

/** The staleness bound in force: max_staleness, else 1 in async mode (slime's one-step-off pipeline), else none. */
export function effectiveMaxStaleness(c: Pick<RunConfig, "max_staleness" | "train_async">): number | null {
  return c.max_staleness ?? (c.train_async ? 1 : null);
}

/** group_extra_samples and weight_load_max_engines: the settings each works with, named when missing. */
function refineEarlyAndStaggered(
  c: { group_extra_samples: number; custom_generate_function_path: string | null; weight_load_max_engines: number | null; weight_update_mode: string },
  ctx: z.RefinementCtx,
): void {
  if (c.group_extra_samples > 0 && c.custom_generate_function_path !== null) {
    ctx.addIssue({
      code: "custom",
      path: ["group_extra_samples"],
      message: `group_extra_samples ${c.group_extra_samples} with custom_generate_function_path: a custom generate function's turns cannot be dropped part-way; set group_extra_samples: 0`,
    });
  }
  if (c.weight_load_max_engines !== null && c.weight_update_mode !== "in_place") {
    ctx.addIssue({
      code: "custom",
      path: ["weight_load_max_engines"],
      message: `weight_load_max_engines ${c.weight_load_max_engines} with weight_update_mode ${c.weight_update_mode}: only engines paused in place keep decoding while others load; set weight_update_mode: in_place or weight_load_max_engines: null`,
    });
  }
}

/**
 * weight_update_mode in_place needs an engine adapter that pauses keeping its requests, loads, and
 * splits each request's tokens at the load (engines/pool-types.ts `InPlacePause`). SGLang loading
 * from disk has one: pause_generation in_place, then update_weights_from_disk, which skips the model
 * update lock while the engine is paused (tokenizer_manager.py update_weights_from_disk,
 * "Immediately update the weights if the engine is in paused state"), then continue_generation.
 * vLLM has one with weight_sync disk too (engines/vllm-in-place.ts). Every other engine and sync is
 * refused before the run starts, saying what it lacks; the pool refuses such a load by name too
 * (engines/pool-versions.ts).
 */
function refineInPlace(
  c: { weight_update_mode: string; weight_sync: string; engine: { kind: string }; custom_generate_function_path?: string | null },
  ctx: z.RefinementCtx,
): void {
  if (c.weight_update_mode !== "in_place") return;
  if ((c.engine.kind === "sglang" || c.engine.kind === "openai") && c.weight_sync === "disk") {
    if (c.custom_generate_function_path)
      ctx.addIssue({
        code: "custom",
        path: ["weight_update_mode"],
        message:
          "weight_update_mode in_place with custom_generate_function_path: a custom generate records one weight version per engine call, " +
          "and a call loaded in place holds tokens of two versions; use weight_update_mode abort or drain with a custom generate",
      });
    return;
  }
  const why: Record<string, string> = {
    sglang:
      c.weight_sync === "trainer_push"
        ? "rlq's trainer push does not pause SGLang in place (POST /pause_generation {mode: in_place}) around its update_weights_from_tensor or update_weights_from_distributed"
        : `SGLang is loaded in place only with weight_sync disk; with weight_sync ${c.weight_sync} nothing is loaded`,
    openai:
      "vLLM is loaded in place only with weight_sync disk (engines/vllm-in-place.ts); with weight_sync " +
      c.weight_sync +
      (c.weight_sync === "none"
        ? " nothing is loaded"
        : " the trainer's push (rlq_torch/weight_push.py VllmPusher) pauses vLLM with mode=abort around its weight transfer, not in place"),
    embedded: "the embedded engine has no pause that keeps its requests",
  };
  ctx.addIssue({
    code: "custom",
    path: ["weight_update_mode"],
    message: `weight_update_mode in_place with engine.kind ${c.engine.kind}: ${why[c.engine.kind] ?? "this engine cannot pause keeping its requests"}; use weight_update_mode abort or drain`,
  });
}
