/**
 * `rlq config check`: keys a config writes that validate but change nothing
 * for the trainer, the engine and the mode this run uses, and slime defaults
 * that rlq does not share. Each warning names the key, why it is inert here,
 * and what would make it matter. The rules follow where each key is read
 * (src/ and workers/trainer-torch).
 */

import { misKeys } from "../algorithms/mis.ts";
import { effectiveMaxStaleness, type RunConfig } from "./run-config.ts";

export interface CheckWarning {
  key: string;
  message: string;
}

interface Rule {
  keys: readonly string[];
  /** True when the keys change nothing for this config. */
  isInert: (c: RunConfig) => boolean;
  /** Why they change nothing here. */
  why: string | ((c: RunConfig) => string);
  /** What would make them matter (null: nothing in rlq does). */
  matters: string | null;
}

const torchTrainerKeys = [
  "use_dynamic_batch_size",
  "num_critic_only_steps",
  "critic_lr",
  "gradient_checkpointing",
  "hf_save_dtype",
  "tensor_model_parallel_size",
  "context_parallel_size",
  "sequence_parallel",
  "lora_rank",
  "lora_alpha",
  "lora_dropout",
  "target_modules",
] as const;
const criticKeys = ["value_clip", "num_critic_only_steps", "critic_lr"] as const;
const remoteEngineKeys = [
  "sglang_server_concurrency",
  "rollout_health_check_interval",
  "rollout_health_check_timeout",
  "rollout_health_check_first_wait",
  "weight_sync",
  "weight_sync_timeout_s",
  "update_weights_interval",
] as const;
const evalKeys = [
  "n_samples_per_eval_prompt",
  "eval_temperature",
  "eval_top_p",
  "eval_top_k",
  "eval_max_response_len",
  "eval_input_key",
  "eval_label_key",
  "eval_tool_key",
  "eval_max_prompt_len",
  "eval_apply_chat_template_kwargs",
  "eval_pass_k",
  "skip_eval_before_train",
] as const;
const wandbKeys = ["wandb_project", "wandb_group", "wandb_team", "wandb_host", "wandb_key", "wandb_mode", "wandb_dir"] as const;
const pluginPathKeys = ["custom_rm_path", "custom_generate_function_path", "dynamic_sampling_filter_path", "buffer_filter_path"] as const;

const isHttp = (p: string | null) => p !== null && /^https?:\/\//i.test(p.trim());

/** In order: the first rule that finds a key inert gives its warning (the trainer and engine first, then the settings). */
const rules: Rule[] = [
  {
    keys: torchTrainerKeys,
    isInert: (c) => c.trainer.kind === "embedded",
    why: "only the torch trainer reads it (packing, the PPO critic, memory and Hugging Face output), and trainer.kind is embedded",
    matters: "trainer: {kind: remote, url: ...} served by workers/trainer-torch/server.py",
  },
  {
    keys: remoteEngineKeys,
    isInert: (c) => c.engine.kind === "embedded",
    why: "it configures remote engines (concurrency, health checks, weight sync), and engine.kind is embedded",
    matters: "engine.kind sglang or openai",
  },
  {
    keys: ["trainer_unreachable_timeout_s"],
    isInert: (c) => c.trainer.kind === "embedded",
    why: "only a remote trainer can be unreachable, and trainer.kind is embedded",
    matters: "trainer: {kind: remote, url: ...}",
  },
  {
    keys: ["update_weights_interval", "weight_sync_timeout_s", "weight_update_mode"],
    isInert: (c) => c.weight_sync === "none",
    why: "weight_sync is none: the engines keep their starting weights for the whole run",
    matters: "weight_sync: disk or trainer_push",
  },
  {
    keys: ["weight_sync_timeout_s"],
    isInert: (c) => c.weight_sync !== "trainer_push",
    why: (c) => `only trainer_push waits for the engines to report a version, and weight_sync is ${c.weight_sync}`,
    matters: "weight_sync: trainer_push",
  },
  {
    keys: ["weight_update_mode"],
    isInert: (c) => !c.train_async,
    why: "in sync mode the engines load new weights between steps, with no generation in flight to abort or drain",
    matters: "train_async: true",
  },
  {
    keys: ["partial_rollout"],
    isInert: (c) => c.train_async,
    why: "in async mode surplus groups are discarded, never buffered for the next step (core/decide-groups.ts)",
    matters: "train_async: false",
  },
  {
    keys: ["staleness_policy"],
    isInert: (c) => effectiveMaxStaleness(c) === null,
    why: "no staleness bound is in force (max_staleness is null in sync mode)",
    matters: "max_staleness: N, or train_async: true (bound 1)",
  },
  {
    keys: ["max_regenerations"],
    isInert: (c) => c.staleness_policy !== "drop",
    why: (c) => `staleness_policy is ${c.staleness_policy}`,
    matters: "staleness_policy: drop",
  },
  {
    keys: ["loss_mask_type"],
    isInert: () => true,
    why: "slime uses it only for SFT loss masks, and rlq's mask comes from generation (model tokens 1, tool tokens 0)",
    matters: null,
  },
  {
    keys: ["opd_kl_coef", "opd_type", "opd_teacher"],
    isInert: (c) => !c.use_opd,
    why: "it configures on-policy distillation, and use_opd is false",
    matters: "use_opd: true",
  },
  {
    keys: criticKeys,
    isInert: (c) => c.advantage_estimator !== "ppo",
    why: (c) => `only PPO's critic reads it, and advantage_estimator is ${c.advantage_estimator}`,
    matters: "advantage_estimator: ppo with the torch trainer",
  },
  {
    keys: ["kl_loss_coef", "use_unbiased_kl"],
    isInert: (c) => !c.use_kl_loss,
    why: "use_kl_loss is false: no KL loss term is computed",
    matters: "use_kl_loss: true",
  },
  {
    keys: ["kl_loss_type"],
    isInert: (c) => !c.use_kl_loss && c.kl_coef === 0,
    why: "neither a KL loss (use_kl_loss) nor a KL reward penalty (kl_coef) is on",
    matters: "use_kl_loss: true or kl_coef != 0",
  },
  {
    keys: ["tis_clip", "tis_clip_low", "tis_function"],
    isInert: (c) => !c.use_tis && !c.get_mismatch_metrics,
    why: "use_tis and get_mismatch_metrics are false: no importance weights are computed",
    matters: "use_tis: true (or get_mismatch_metrics: true)",
  },
  {
    keys: misKeys,
    isInert: (c) => c.tis_function !== "mis" || (!c.use_tis && !c.get_mismatch_metrics),
    why: (c) => (c.tis_function !== "mis" ? `it configures MIS, and tis_function is ${c.tis_function}` : "it configures MIS, and use_tis is false"),
    matters: "tis_function: mis and use_tis: true",
  },
  { keys: ["opsm_delta"], isInert: (c) => !c.use_opsm, why: "use_opsm is false", matters: "use_opsm: true" },
  {
    keys: ["gamma", "lambd"],
    isInert: (c) => !["ppo", "reinforce_plus_plus"].includes(c.advantage_estimator),
    why: (c) => `advantage_estimator is ${c.advantage_estimator}, which does not discount`,
    matters: "advantage_estimator: ppo or reinforce_plus_plus",
  },
  {
    keys: ["grpo_std_normalization"],
    isInert: (c) => !["grpo", "gspo", "cispo"].includes(c.advantage_estimator),
    why: (c) => `advantage_estimator is ${c.advantage_estimator}`,
    matters: "advantage_estimator: grpo, gspo or cispo",
  },
  {
    keys: ["lr_decay_iters", "min_lr"],
    isInert: (c) => c.lr_decay_style === "constant",
    why: "lr_decay_style is constant",
    matters: "lr_decay_style: linear or cosine",
  },
  {
    keys: evalKeys,
    isInert: (c) => c.eval_interval === null,
    why: "eval_interval is null, so evals never run",
    matters: "eval_interval: N (and eval_prompt_data)",
  },
  { keys: ["mask_offpolicy_in_partial_rollout"], isInert: (c) => !c.partial_rollout, why: "partial_rollout is false", matters: "partial_rollout: true" },
  {
    keys: ["num_epoch"],
    isInert: (c) => c.num_rollout !== null,
    why: "num_rollout is set, and it decides the run's length (as in slime)",
    matters: "leaving num_rollout out",
  },
  { keys: ["rm_url", "rm_api_key"], isInert: (c) => c.rm_type?.trim() !== "remote_rm", why: "rm_type is not remote_rm", matters: "rm_type: remote_rm" },
  {
    keys: ["group_rm"],
    isInert: (c) => c.custom_rm_path === null,
    why: "group_rm picks the group signature of custom_rm_path, and rm_type's built-in rewards score one sample at a time",
    matters: "custom_rm_path naming a group reward function",
  },
  {
    keys: ["plugin_api_key"],
    isInert: (c) => !pluginPathKeys.some((k) => isHttp(c[k])),
    why: "no plugin path is an http(s):// URL",
    matters: "an http(s):// custom_rm_path, filter or custom_generate_function_path",
  },
  { keys: ["apply_chat_template_kwargs"], isInert: (c) => !c.apply_chat_template, why: "apply_chat_template is false", matters: "apply_chat_template: true" },
  { keys: wandbKeys, isInert: (c) => !c.use_wandb, why: "use_wandb is false: nothing is sent to W&B", matters: "use_wandb: true" },
  {
    keys: ["hf_checkpoint"],
    isInert: (c) => c.engine.kind === "embedded" && c.trainer.kind === "embedded" && c.tokenizer !== "hf" && !c.apply_chat_template,
    why: "the embedded engine and trainer serve ref_load's model, and neither the tokenizer (hf) nor a chat template reads it",
    matters: "tokenizer: hf, apply_chat_template: true, or a remote trainer",
  },
];

/** slime (Megatron) defaults that rlq does not share, for keys a config leaves out. */
export const slimeDefaultDrift: ReadonlyArray<{ key: keyof RunConfig; rlq: unknown; slime: unknown }> = [
  { key: "lr_decay_style", rlq: "constant", slime: "linear" },
  { key: "weight_decay", rlq: 0, slime: 0.01 },
  { key: "label_key", rlq: "label", slime: null },
];

/** The keys `raw` writes that change nothing for `c`, one warning per key, then the slime defaults `raw` leaves out. */
export function checkConfig(raw: Record<string, unknown>, c: RunConfig): CheckWarning[] {
  const out: CheckWarning[] = [];
  const warned = new Set<string>();
  for (const rule of rules) {
    if (!rule.isInert(c)) continue;
    const why = typeof rule.why === "string" ? rule.why : rule.why(c);
    for (const key of rule.keys) {
      if (!(key in raw) || warned.has(key)) continue;
      warned.add(key);
      const matters = rule.matters === null ? "no rlq setting makes it matter: remove it" : `it takes effect with ${rule.matters}`;
      out.push({ key, message: `${key} has no effect here: ${why}; ${matters}` });
    }
  }
  for (const d of slimeDefaultDrift) {
    if (d.key in raw) continue;
    out.push({
      key: d.key,
      message: `${d.key} is left out: rlq's default is ${JSON.stringify(d.rlq)}, slime's (Megatron's) is ${JSON.stringify(d.slime)}; write it to be sure which one you get`,
    });
  }
  return out;
}

/** Every key some rule covers (the test checks each against a config where it is inert). */
export const checkedKeys: ReadonlySet<string> = new Set(rules.flatMap((r) => r.keys));
