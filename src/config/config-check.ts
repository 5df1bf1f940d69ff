import { misKeys } from "../algorithms/mis.ts";
import type { RunConfig } from "./run-config.ts";

/**
 * `rlq config check`: keys a config writes that validate but change nothing
 * with the rest of this config, and slime defaults that rlq does not share.
 * The rules follow where each key is read (src/ and workers/trainer-torch).
 */
export interface CheckWarning {
  key: string;
  message: string;
}

type Rule = [keys: readonly string[], unused: (c: RunConfig) => boolean, why: string];

const remote = (c: RunConfig) => c.engine.kind !== "embedded";
const rules: Rule[] = [
  [["loss_mask_type"], () => true, "accepted for slime's scripts; slime uses it only for SFT loss masks, and rlq's mask comes from generation"],
  [["kl_loss_coef", "use_unbiased_kl"], (c) => !c.use_kl_loss, "needs use_kl_loss: true"],
  [["kl_loss_type"], (c) => !c.use_kl_loss && c.kl_coef === 0, "needs use_kl_loss: true or kl_coef != 0"],
  [["tis_clip", "tis_clip_low", "tis_function"], (c) => !c.use_tis && !c.get_mismatch_metrics, "needs use_tis: true (or get_mismatch_metrics: true)"],
  [misKeys, (c) => c.tis_function !== "mis" || (!c.use_tis && !c.get_mismatch_metrics), "configures MIS: needs tis_function: mis and use_tis: true"],
  [["opsm_delta"], (c) => !c.use_opsm, "needs use_opsm: true"],
  [["gamma", "lambd"], (c) => !["ppo", "reinforce_plus_plus"].includes(c.advantage_estimator), "used by ppo and reinforce_plus_plus only"],
  [["value_clip"], (c) => c.advantage_estimator !== "ppo", "used by ppo's critic only"],
  [["grpo_std_normalization"], (c) => !["grpo", "gspo", "cispo"].includes(c.advantage_estimator), "used by grpo, gspo and cispo only"],
  [["lr_decay_iters", "min_lr"], (c) => c.lr_decay_style === "constant", "needs lr_decay_style linear or cosine"],
  [
    [
      "n_samples_per_eval_prompt",
      "eval_temperature",
      "eval_top_p",
      "eval_top_k",
      "eval_max_response_len",
      "eval_input_key",
      "eval_label_key",
      "eval_pass_k",
      "skip_eval_before_train",
    ],
    (c) => c.eval_interval === null,
    "needs eval_interval (evals never run without it)",
  ],
  [["mask_offpolicy_in_partial_rollout"], (c) => !c.partial_rollout, "needs partial_rollout: true"],
  [["max_regenerations"], (c) => c.staleness_policy !== "drop", "needs staleness_policy: drop"],
  [["staleness_policy", "weight_update_mode"], (c) => !c.train_async && c.max_staleness === null, "needs train_async or max_staleness"],
  [
    [
      "sglang_server_concurrency",
      "rollout_health_check_interval",
      "rollout_health_check_timeout",
      "rollout_health_check_first_wait",
      "weight_sync",
      "weight_sync_timeout_s",
    ],
    (c) => !remote(c),
    "configures remote engines; engine.kind is embedded",
  ],
  [["rm_url"], (c) => c.rm_type?.trim() !== "remote_rm", "needs rm_type: remote_rm"],
  [["apply_chat_template_kwargs"], (c) => !c.apply_chat_template, "needs apply_chat_template: true"],
];

/** slime (Megatron) defaults that rlq does not share, for keys a config leaves out. */
export const slimeDefaultDrift: ReadonlyArray<{ key: keyof RunConfig; rlq: unknown; slime: unknown }> = [
  { key: "lr_decay_style", rlq: "constant", slime: "linear" },
  { key: "weight_decay", rlq: 0, slime: 0.01 },
  { key: "label_key", rlq: "label", slime: null },
];

export function checkConfig(raw: Record<string, unknown>, c: RunConfig): CheckWarning[] {
  const out: CheckWarning[] = [];
  for (const [keys, unused, why] of rules) {
    if (!unused(c)) continue;
    for (const key of keys) if (key in raw) out.push({ key, message: `${key} has no effect here: ${why}` });
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
