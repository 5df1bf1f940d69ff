/**
 * What becomes of each of slime's command-line flags in rlq: taken as is,
 * renamed, dropped (they configure something rlq does not run: Megatron,
 * SGLang's launch, the Ray cluster, a logger), or unsupported (a feature rlq
 * does not have, with the reason). One table serves `rlq config import-slime`
 * and the hint that follows an unknown key in a run config.
 *
 * Read from THUDM/slime 624b824 (slime/utils/arguments.py: add_*_arguments and
 * slime_validate_args); flags slime does not declare go to Megatron's parser,
 * so an unknown flag that is not SGLang's is classed as Megatron's.
 */

export type DropGroup = "megatron" | "sglang" | "cluster" | "logging" | "checkpoint";

export type FlagDisposition =
  /** The snake_case name is an rlq key with slime's meaning. */
  | { kind: "same" }
  /** slime's flag is written as `key` in rlq (`value`: the fixed value a negative flag sets). */
  | { kind: "renamed"; key: string; value?: unknown; note: string }
  | { kind: "dropped"; group: DropGroup; note: string }
  | { kind: "unsupported"; why: string };

export const dropGroupTitles: Record<DropGroup, string> = {
  megatron: "Megatron (model shape, parallelism, kernels, precision): the trainer owns them",
  sglang: "SGLang launch: rlq connects to servers you start (engine.urls / engine.router_url)",
  cluster: "Ray cluster placement: rlq's workers and trainers are separate processes you place",
  logging:
    "wandb/tensorboard flags rlq has no counterpart for (rlq's own sinks: tensorboard_dir, use_wandb, wandb_project, wandb_group, wandb_mode; docs/observability.md)",
  checkpoint: "Megatron checkpoints: rlq resumes from its own committed checkpoints",
};

/** slime's names → rlq's, where the meaning is the same under another name or form. */
const renamed: Record<string, { key: string; value?: unknown; note: string }> = {
  disable_rewards_normalization: { key: "rewards_normalization", value: false, note: "negative flag: rlq stores slime's dest name" },
  disable_grpo_std_normalization: { key: "grpo_std_normalization", value: false, note: "negative flag: rlq stores slime's dest name" },
  save: { key: "checkpoint_dir", note: "where committed checkpoints are written" },
  custom_tis_function_path: { key: "tis_function", note: "rlq names the built-in correction: vanilla, icepop or mis" },
  sglang_router_ip: { key: "engine.router_url", note: "with sglang_router_port: http://IP:PORT" },
  sglang_router_port: { key: "engine.router_url", note: "with sglang_router_ip: http://IP:PORT" },
  rollout_external_engine_addrs: { key: "engine.urls", note: "rlq always talks to external engines" },
};

const unsupported: Record<string, string> = {
  loss_type: "rlq trains policy_loss only (no sft_loss / custom_loss)",
  custom_loss_function_path: "rlq trains policy_loss only; a loss is not a plugin",
  custom_advantage_function_path: "advantages are rlq's built-in estimators (advantage_estimator)",
  disable_compute_advantages_and_returns: "advantages are always computed by rlq",
  custom_pg_loss_reducer_function_path: "aggregation is built in (calculate_per_token_loss)",
  use_routing_replay: "MoE routing replay needs Megatron's router",
  use_rollout_routing_replay: "MoE routing replay needs Megatron's router",
  use_rollout_entropy: "the trainer computes entropy itself",
  reset_optimizer_states: "the optimizer state is part of each committed checkpoint",
  use_stateless_adam: "rlq's trainers keep Adam state",
  use_opd: "on-policy distillation needs a teacher's log-probs, which no rlq trainer provides",
  opd_type: "on-policy distillation is not supported (see use_opd)",
  opd_kl_coef: "on-policy distillation is not supported (see use_opd)",
  opd_teacher_load: "on-policy distillation is not supported (see use_opd)",
  opd_teacher_ckpt_step: "on-policy distillation is not supported (see use_opd)",
  num_critic_only_steps: "no rlq trainer has a critic yet",
  ref_update_interval: "the reference model is fixed at ref_load",
  keep_old_actor: "old log-probs come from the trainer's recompute or the rollout (use_rollout_logprobs)",
  multimodal_keys: "rlq's prompts are text",
  rollout_sample_hook_path: "no per-sample hooks; a custom_generate_function_path can do the same work",
  custom_rollout_log_function_path: "metrics are rows in Postgres (rlq sql)",
  custom_eval_rollout_log_function_path: "metrics are rows in Postgres (rlq sql)",
  rollout_data_postprocess_path: "train data is built by rlq from recorded facts",
  custom_reward_post_process_path: "reward post-processing is built in (rewards_normalization, grpo_std_normalization)",
  custom_convert_samples_to_train_data_path: "train data is built by rlq from recorded facts",
  rollout_sample_filter_path: "use dynamic_sampling_filter_path (a group filter)",
  rollout_all_samples_process_path: "use dynamic_sampling_filter_path (a group filter)",
  data_source_path: "rlq's data source is the durable cursor over prompt_data",
  disable_rollout_global_dataset: "rlq always reads prompt_data",
  start_rollout_id: "rlq resumes at the run's last committed step",
  rollout_buffer_url: "the external rollout buffer server: use rollout_function_path or custom_generate_function_path",
  fetch_trajectory_retry_times: "the external rollout buffer server is not supported",
  min_batch_collection_ratio: "the external rollout buffer server is not supported",
  rollout_task_type: "the external rollout buffer server is not supported",
  data_pad_size_multiplier: "the external rollout buffer server is not supported",
  eval_function_path: "evals use the run's rollout (or rollout_function_path)",
  eval_config: "write the eval_* keys in the run config",
  eval_tool_key: "evals read the run's tool_key",
  eval_max_prompt_len: "evals use rollout_max_prompt_len",
  eval_min_new_tokens: "no min_new_tokens sampling parameter",
  eval_max_context_len: "evals use rollout_max_context_len",
  eval_reward_key: "evals use reward_key",
  rollout_skip_special_tokens: "rlq decodes token ids itself (the tokenizer from hf_checkpoint)",
  rollout_stop: "stop strings are not supported: use rollout_stop_token_ids",
  model_name: "the model is hf_checkpoint",
  save_hf: "committed checkpoints are the trainer's format (the torch trainer writes Hugging Face safetensors)",
  ref_ckpt_step: "ref_load names one checkpoint",
  save_debug_rollout_data: "every sample is a row already: rlq export RUN --format jsonl",
  load_debug_rollout_data: "every step's batch is recorded: rlq retrain RUN --step S replays it into the trainer",
  load_debug_rollout_data_subsample: "rlq retrain RUN --step S replays a whole step's batch",
  load_forge_rollout_data: "rlq retrain RUN --step S replays a recorded step; forged rollouts are not supported",
  save_debug_train_data: "train batches are rebuilt from facts (rlq replay)",
  dump_details: "every sample is a row already: rlq export RUN --format jsonl",
  debug_rollout_only: "no debug modes",
  debug_train_only: "no debug modes",
  check_weight_update_equal: "weight sync is verified by checkpoint hash",
  use_fault_tolerance: "rlq always health-checks remote engines (rollout_health_check_*)",
  http_proxy: "no proxy setting",
  use_distributed_post: "no proxy setting",
  update_weight_mode: "weights sync through weight_sync (disk or trainer_push)",
  update_weight_transport: "weights sync through weight_sync (disk or trainer_push)",
  update_weight_buffer_size: "weights sync through weight_sync (disk or trainer_push)",
  rollout_data_transport: "samples travel as rows in Postgres",
  ci_test: "slime's CI only",
  ci_disable_kl_checker: "slime's CI only",
  ci_load_grad_norm: "slime's CI only",
  ci_save_grad_norm: "slime's CI only",
  ci_train_rollout_logprob_abs_diff_threshold: "slime's CI only (rlq reports train_rollout_logprob_abs_diff as a metric)",
  freeze_params_name_list: "rlq's trainers train every parameter",
  only_train_params_name_list: "rlq's trainers train every parameter",
  enable_mtp_training: "multi-token-prediction training needs Megatron's MTP layers",
  update_weight_delta_encoding: "weights sync through weight_sync (disk or trainer_push)",
  update_weight_delta_checksum: "weights sync through weight_sync (disk or trainer_push)",
  update_weight_disk_dir: "weights sync through weight_sync (disk or trainer_push)",
  update_weight_disk_keep_files: "weights sync through weight_sync (disk or trainer_push)",
  update_weight_local_checkpoint_dir: "weights sync through weight_sync (disk or trainer_push)",
  custom_update_weight_post_write_path: "weights sync through weight_sync (disk or trainer_push)",
  memory_recorder: "profiling belongs to the trainer's own tools",
  memory_snapshot_dir: "profiling belongs to the trainer's own tools",
  memory_snapshot_num_steps: "profiling belongs to the trainer's own tools",
  profile_target: "profiling belongs to the trainer's own tools",
};

const megatronKept = new Set([
  "lr",
  "min_lr",
  "lr_decay_style",
  "lr_warmup_iters",
  "lr_decay_iters",
  "weight_decay",
  "adam_beta1",
  "adam_beta2",
  "adam_eps",
  "clip_grad",
  "seed",
  "global_batch_size",
  "save_interval",
]);

const sglangNames = new Set(["rollout_num_gpus_per_engine", "sglang_server_concurrency"]);
const clusterNames = new Set([
  "actor_num_nodes",
  "actor_num_gpus_per_node",
  "critic_num_nodes",
  "critic_num_gpus_per_node",
  "rollout_num_gpus",
  "num_gpus_per_node",
  "colocate",
  "offload",
  "offload_train",
  "offload_rollout",
  "train_env_vars",
  "train_backend",
]);
const loggingPrefixes = ["wandb_", "tb_", "use_wandb", "use_tensorboard", "log_", "disable_wandb_random_suffix"];
const checkpointNames = new Set(["load", "ref_load", "async_save", "no_save_optim", "no_load_optim", "no_load_rng", "ckpt_step", "release_train"]);
/** Megatron flags that also choose something rlq decides for itself. */
const megatronNotes: Record<string, string> = {
  optimizer: "rlq's trainers use Adam(W) with adam_beta1/adam_beta2/adam_eps",
  micro_batch_size: "micro-batching is the trainer's business; max_tokens_per_gpu bounds a micro-batch",
  use_dynamic_batch_size: "max_tokens_per_gpu bounds a micro-batch",
  balance_data: "data balancing across DP ranks",
  log_probs_max_tokens_per_gpu: "the trainer's recompute batching",
};

/**
 * Plugin flags whose value is slime's own default implementation, which rlq
 * has built in: the flag is redundant, not a Python module to load.
 */
export const slimeBuiltinDefaults: Readonly<Record<string, string>> = {
  rollout_function_path: "slime.rollout.sglang_rollout.generate_rollout",
  data_source_path: "slime.rollout.data_source.RolloutDataSourceWithBuffer",
};

/** `--eps-clip-high` → `eps_clip_high`. */
export function flagToKey(flag: string): string {
  return flag.replace(/^-+/, "").replace(/-/g, "_");
}

/**
 * The disposition of slime's flag `key` (snake_case, no dashes). `rlqKeys`
 * are the run config's own keys (a flag of that name is taken as is).
 */
export function classifySlimeFlag(key: string, rlqKeys: ReadonlySet<string>): FlagDisposition {
  const r = renamed[key];
  if (r) return { kind: "renamed", ...r };
  if (megatronNotes[key]) return { kind: "dropped", group: "megatron", note: megatronNotes[key] };
  if (checkpointNames.has(key)) {
    return {
      kind: "dropped",
      group: "checkpoint",
      note:
        key === "ref_load"
          ? "a Megatron torch_dist checkpoint; a remote trainer starts from hf_checkpoint"
          : "rlq resumes a run from Postgres and its committed checkpoints",
    };
  }
  if (rlqKeys.has(key)) return { kind: "same" };
  const why = unsupported[key];
  if (why) return { kind: "unsupported", why };
  if (key.startsWith("sglang_") || sglangNames.has(key))
    return { kind: "dropped", group: "sglang", note: "engine settings belong to the SGLang server you start" };
  if (clusterNames.has(key)) return { kind: "dropped", group: "cluster", note: "no Ray placement" };
  if (loggingPrefixes.some((p) => key.startsWith(p))) return { kind: "dropped", group: "logging", note: "metrics are Postgres rows" };
  if (megatronKept.has(key)) return { kind: "same" };
  return { kind: "dropped", group: "megatron", note: "a Megatron flag" };
}

/** Megatron flags slime's scripts pass (model shape, parallelism, kernels, precision, optimizer offload). */
const megatronPattern =
  /^(tensor_model_parallel|pipeline_model_parallel|context_parallel|expert_|sequence_parallel|recompute_|attention_|hidden_dropout|moe_|num_layers|hidden_size|ffn_hidden_size|num_attention_heads|group_query_attention|num_query_groups|kv_channels|qk_layernorm|swiglu|normalization|norm_epsilon|rotary_|use_rotary|disable_bias_linear|vocab_size|untie_embeddings|position_embedding|make_vocab_size|bf16|fp16|fp8|accumulate_allreduce|optimizer_|overlap_|use_precision_aware|use_distributed_optimizer|transformer_impl|megatron_|custom_megatron_|calculate_per_token_loss_|use_flash_attn|max_position_embeddings|seq_length|tokenizer_type|add_qkv_bias|kv_lora_rank|q_lora_rank|qk_head_dim|qk_pos_emb_head_dim|v_head_dim|multi_latent_attention|mtp_|enable_mtp)/;

/**
 * What to write instead of an unknown run-config key that is one of slime's
 * flags (null: not a slime flag rlq knows of). Used in the "unknown key" error.
 */
export function unknownKeyHint(key: string, rlqKeys: ReadonlySet<string>): string | null {
  const d = classifySlimeFlag(key, rlqKeys);
  if (d.kind === "dropped" && d.group === "megatron" && d.note === "a Megatron flag" && !megatronPattern.test(key)) return null;
  switch (d.kind) {
    case "same":
      return null;
    case "renamed":
      return d.value === undefined ? `write ${d.key} instead (${d.note})` : `write ${d.key}: ${JSON.stringify(d.value)} instead (${d.note})`;
    case "dropped":
      return `drop it: ${dropGroupTitles[d.group]}${d.group === "megatron" && d.note !== "a Megatron flag" ? `; ${d.note}` : ""}`;
    case "unsupported":
      return `rlq does not support it: ${d.why}`;
  }
}
