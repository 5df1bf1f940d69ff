/**
 * What becomes of each of slime's command-line flags in rlq. One table serves
 * `rlq config import-slime`, the hint that follows an unknown key in a run
 * config, and the test that walks every flag slime declares
 * (test/fixtures/slime-flags-624b824.json, made by scripts/extract-slime-flags.py).
 *
 * Every flag has one of these dispositions:
 * - mapped: an rlq key with slime's meaning (`same`, possibly with a named
 *   `difference`), or under another name or form (`renamed`);
 * - dropped: it configures machinery rlq does not run, and leaving it out
 *   changes nothing the run computes (Megatron's parallelism and kernels,
 *   placement, logging, slime's runtime mechanics); `elsewhere` groups name the
 *   program that takes it instead (the SGLang server or router you start);
 * - unsupported: a feature rlq does not have, so leaving it out changes what
 *   the run does; with the reason and what to do instead.
 * `custom_config_path` is read by the importer itself (its YAML's settings are
 * imported as if given on the command line), and so is `eval_config` (its
 * datasets become eval_prompt_data entries with their overrides).
 *
 * Read from THUDM/slime 624b824a898ab0ec1fcb4d373004c7f3852bf515
 * (slime/utils/arguments.py, slime/backends/sglang_utils/arguments.py) with
 * the SGLang and router versions slime pins there (sglang 0.5.15.post1's
 * ServerArgs as `--sglang-*`, sglang-router 0.3.2's RouterArgs as `--router-*`).
 * Flags slime does not declare go to Megatron's parser.
 */

export type DropGroup = "megatron" | "placement" | "sglang" | "router" | "logging" | "checkpoint" | "runtime" | "debug";

export type FlagDisposition =
  /** The snake_case name is an rlq key with slime's meaning; `difference` names where rlq's reading differs. */
  | { kind: "same"; difference?: string }
  /** slime's flag is written as `key` in rlq (`value`: the fixed value a negative flag sets). */
  | { kind: "renamed"; key: string; value?: unknown; note: string }
  /** Leaving it out changes nothing the run computes; `note` says why (and where it goes instead). */
  | { kind: "dropped"; group: DropGroup; note: string }
  /** A feature rlq does not have: leaving it out changes what the run does. */
  | { kind: "unsupported"; why: string; instead: string }
  /** Read by the importer itself (custom_config_path, eval_config). */
  | { kind: "read"; note: string };

export const dropGroupTitles: Record<DropGroup, string> = {
  megatron: "Megatron (model shape, parallelism, kernels, precision, memory): the trainer owns them",
  placement: "placement (Ray, colocation, offload): rlq's trainer and engines are separate processes you place, each on GPUs of its own",
  sglang: "SGLang launch: pass these to the SGLang server you start (rlq connects to it: engine.urls / engine.router_url)",
  router: "SGLang router: pass these to the router you start (python -m sglang_router.launch_router; rlq connects to engine.router_url)",
  logging:
    "wandb/tensorboard flags rlq has no counterpart for (rlq's own sinks: tensorboard_dir, use_wandb, wandb_project, wandb_group, wandb_team, wandb_mode; docs/observability.md)",
  checkpoint: "Megatron checkpoints: rlq starts from hf_checkpoint and resumes from its own committed checkpoints",
  runtime: "slime's runtime mechanics that rlq does its own way (weight transfer, sample transport, fault tolerance, proxies)",
  debug: "debugging, profiling and CI aids: every sample and step is a row in Postgres (rlq export, rlq sql, rlq retrain)",
};

/** slime's names → rlq's, where the meaning is the same under another name or form. */
const renamed: Record<string, { key: string; value?: unknown; note: string }> = {
  disable_rewards_normalization: { key: "rewards_normalization", value: false, note: "negative flag: rlq stores slime's dest name" },
  disable_grpo_std_normalization: { key: "grpo_std_normalization", value: false, note: "negative flag: rlq stores slime's dest name" },
  save: { key: "checkpoint_dir", note: "where committed checkpoints are written" },
  custom_tis_function_path: { key: "tis_function", note: "rlq names the built-in correction: vanilla, icepop or mis" },
  sglang_router_ip: { key: "engine.router_url", note: "with sglang_router_port: http://IP:PORT" },
  sglang_router_port: { key: "engine.router_url", note: "with sglang_router_ip: http://IP:PORT" },
  sglang_router_request_timeout_secs: { key: "engine.request_timeout_s", note: "the timeout of one generate request" },
  rollout_external_engine_addrs: { key: "engine.urls", note: "rlq always talks to external engines" },
  wandb_key: { key: "wandb_key", note: "a reference to the key ({env: NAME}), never the key itself" },
  sglang_api_key: { key: "engine.api_key", note: "rlq sends it ({env: NAME}); start the SGLang server with the same --api-key" },
  sglang_admin_api_key: { key: "engine.admin_api_key", note: "rlq sends it on admin routes ({env: NAME}); start the server with the same --admin-api-key" },
  debug_train_only: {
    key: "debug_rollouts_from",
    value: "RUN_ID",
    note: "train only on a recorded run's rollouts (rlq keeps every rollout in Postgres): put that run's id here",
  },
  router_api_key: { key: "engine.router_api_key", note: "rlq sends it to the router ({env: NAME}); start the router with the same --api-key" },
};

/** Differences in how rlq reads a key it shares with slime. */
const differences: Record<string, string> = {
  multimodal_keys:
    "images are loaded and checked when the dataset loads (a missing one is a bad row); media type image only; needs apply_chat_template; the trainer side is not built yet",
  use_opd:
    "the teacher is rlq's opd_teacher engine (slime finds it through --rm-url and its OPD reward function): add opd_teacher: {kind: sglang|vllm, url} to the imported run",
  use_dynamic_batch_size:
    "read by the torch trainer (workers/trainer-torch): it packs each micro-batch into one row of up to max_tokens_per_gpu tokens; the embedded trainer ignores it",
  num_critic_only_steps: "read by the torch trainer's critic (advantage_estimator: ppo); the embedded trainer has no critic",
  save_interval: "a retention policy: every step is committed, and steps t with (t+1) % N == 0 are kept (docs/slime-configs.md)",
  sglang_server_concurrency: "rlq's in-flight requests per engine (slime's client-side semaphore)",
  max_tokens_per_gpu: "bounds a micro-batch's tokens in both trainers",
  loss_type: "policy_loss or sft_loss (an SFT run: the controller feeds the rows' responses to the PyTorch trainer, docs/sft.md); custom_loss is not supported",
};

const U = (why: string, instead: string) => ({ why, instead });
const megatronTeacher = U(
  "the teacher of opd_type megatron is a checkpoint loaded inside slime's Megatron trainer, which rlq does not run",
  "serve the teacher with SGLang or vLLM and write opd_type: sglang with opd_teacher: {kind, url} (docs/algorithms.md On-policy distillation)",
);
const notBufferServer = U("slime's external rollout buffer server is not supported", "write rollout_function_path or custom_generate_function_path");
const allParams = U("rlq's trainers train every parameter", "remove it, or freeze parameters in your own trainer server");
const customTrainData = U("train data is built by rlq from recorded facts", "shape samples in custom_generate_function_path or a reward plugin");
const routing = U("MoE routing replay needs Megatron's router", "remove it (the torch trainer routes with the Hugging Face model's own router)");

/** Features rlq does not have: dropping the flag changes what the run does. */
const unsupported: Record<string, { why: string; instead: string }> = {
  custom_loss_function_path: U(
    "rlq trains policy_loss only; a loss is not a plugin",
    "pick the built-in terms: eps_clip*, use_kl_loss, entropy_coef, use_opsm",
  ),
  custom_advantage_function_path: U(
    "advantages are rlq's built-in estimators",
    "set advantage_estimator (grpo, gspo, cispo, reinforce_plus_plus(_baseline), ppo)",
  ),
  disable_compute_advantages_and_returns: U("advantages are always computed by rlq", "remove it"),
  custom_pg_loss_reducer_function_path: U("aggregation is built in", "set calculate_per_token_loss"),
  use_routing_replay: routing,
  use_rollout_routing_replay: routing,
  use_rollout_entropy: U("the trainer computes entropy itself; rollout entropies are not used for masks", "remove it"),
  reset_optimizer_states: U("the optimizer state is part of each committed checkpoint", "remove it"),
  use_stateless_adam: U("rlq's trainers keep Adam state", "remove it"),
  opd_teacher_load: megatronTeacher,
  opd_teacher_ckpt_step: megatronTeacher,
  ref_update_interval: U("the reference model is fixed", "remove it"),
  keep_old_actor: U("old log-probs come from the trainer's recompute or the rollout", "use_rollout_logprobs: true to use the rollout's"),
  rollout_sample_hook_path: U("no per-sample hooks", "do the same work in custom_generate_function_path"),
  rollout_data_postprocess_path: customTrainData,
  custom_reward_post_process_path: U("reward post-processing is built in", "rewards_normalization, grpo_std_normalization, or a group_rm reward"),
  custom_convert_samples_to_train_data_path: customTrainData,
  rollout_sample_filter_path: U("no per-sample filter", "dynamic_sampling_filter_path (a group filter)"),
  rollout_all_samples_process_path: U("no all-samples hook", "dynamic_sampling_filter_path (a group filter)"),
  data_source_path: U("rlq's data source is the durable cursor over prompt_data", "prompt_data (and buffer_filter_path)"),
  disable_rollout_global_dataset: U("rlq always reads prompt_data", "remove it"),
  start_rollout_id: U("rlq resumes at the run's last committed step", "remove it"),
  rollout_buffer_url: notBufferServer,
  fetch_trajectory_retry_times: notBufferServer,
  min_batch_collection_ratio: notBufferServer,
  rollout_task_type: notBufferServer,
  data_pad_size_multiplier: notBufferServer,
  eval_function_path: U("evals use the run's rollout", "rollout_function_path (it also plans evals)"),
  eval_min_new_tokens: U("no min_new_tokens sampling parameter", "remove it"),
  eval_max_context_len: U("rlq has no per-eval context bound", "rollout_max_context_len (the rollout's bound)"),
  eval_reward_key: U("rlq has no per-eval reward key", "reward_key (the rollout's)"),
  rollout_skip_special_tokens: U("rlq decodes token ids itself (the tokenizer from hf_checkpoint)", "remove it"),
  rollout_stop: U("stop strings are not supported", "rollout_stop_token_ids"),
  load_debug_rollout_data: U(
    "rollouts are not loaded from files",
    "debug_rollouts_from: RUN_ID (rlq keeps every rollout in Postgres: a train-only run trains on a recorded run's samples); rlq retrain RUN --step S replays one step's batch",
  ),
  load_debug_rollout_data_subsample: U("rollouts are not loaded from files", "rlq retrain RUN --step S replays a whole step's batch"),
  load_forge_rollout_data: U("forged rollouts are not supported", "rlq retrain RUN --step S replays a recorded step"),
  freeze_params_name_list: allParams,
  only_train_params_name_list: allParams,
  freeze_indexer: allParams,
  enable_mtp_training: U("multi-token-prediction training needs Megatron's MTP layers", "remove it"),
  custom_model_provider_path: U("the model is hf_checkpoint's Hugging Face model", "write the model as a Hugging Face model directory and set hf_checkpoint"),
  custom_megatron_init_path: U("a hook into Megatron's start-up; rlq's trainers have no hooks", "do that work in the trainer server (workers/trainer-torch)"),
  custom_megatron_before_log_prob_hook_path: U("a hook into Megatron's log-prob pass; rlq's trainers have no hooks", "do that work in the trainer server"),
  custom_megatron_before_train_step_hook_path: U("a hook into Megatron's train step; rlq's trainers have no hooks", "do that work in the trainer server"),
  lr_warmup_fraction: U("rlq counts warm-up in steps", "lr_warmup_iters = fraction x lr_decay_iters"),
  lr_warmup_init: U("warm-up starts at 0", "remove it"),
};

/** Flags that change nothing the run computes, by group, with why. */
const dropped: Record<string, [DropGroup, string]> = {
  optimizer: ["megatron", "rlq's trainers use Adam(W) with adam_beta1/adam_beta2/adam_eps"],
  micro_batch_size: ["megatron", "micro-batching is the trainer's business; max_tokens_per_gpu bounds a micro-batch"],
  balance_data: ["megatron", "balances data across DP ranks (speed only)"],
  balance_by_flops: ["megatron", "balances data across DP ranks by FLOPs (speed only)"],
  log_probs_max_tokens_per_gpu: ["megatron", "the trainer's recompute batching (memory only)"],
  log_probs_chunk_size: ["megatron", "computes log-probs in chunks to save memory (memory only)"],
  recompute_loss_function: ["megatron", "recomputes the loss in the backward (memory only); the torch trainer's counterpart is gradient_checkpointing"],
  allgather_cp: ["megatron", "context-parallel all-gather (parallelism only)"],
  // tensor_model_parallel_size and context_parallel_size are imported: they are run-config keys (trainer-torch-keys.ts).
  // sequence_parallel is one too, but the torch trainer's RL step refuses it (Hugging Face builds the attention mask
  // from the cut sequence): imported, every slime TP script (they pass it) would fail its first step.
  sequence_parallel: [
    "megatron",
    "cuts the norms along the sequence under tensor parallel (memory only); the torch trainer's RL step runs tensor_model_parallel_size without it",
  ],
  qwen_gdn_backend: ["megatron", "the GDN kernel for Qwen linear attention (kernels only)"],
  padded_vocab_size: ["megatron", "Megatron's padded embedding size (the Hugging Face model keeps its own)"],
  model_name: ["megatron", "names the Megatron → Hugging Face weight conversion; the model is hf_checkpoint"],
  megatron_config_path: ["megatron", "per-role Megatron overrides (actor, critic); the torch trainer's critic takes critic_lr"],
  megatron_deepgemm_forward_layers: ["megatron", "which layers run DeepGEMM kernels (kernels only)"],
  megatron_deepgemm_forward_modules: ["megatron", "which modules run DeepGEMM kernels (kernels only)"],
  megatron_deepgemm_moe_forward_layers: ["megatron", "which MoE layers run DeepGEMM kernels (kernels only)"],
  megatron_deepgemm_moe_forward_modules: ["megatron", "which MoE modules run DeepGEMM kernels (kernels only)"],
  mtp_num_layers: ["megatron", "Megatron's multi-token-prediction layers (model shape)"],
  mtp_loss_scaling_factor: ["megatron", "weights MTP training, which rlq does not run (enable_mtp_training)"],
  distributed_backend: ["placement", "torch.distributed's backend inside Megatron's processes"],
  distributed_timeout_minutes: ["placement", "torch.distributed's timeout inside Megatron's processes"],
  train_backend: ["placement", "slime's trainer (megatron); rlq's trainer is `trainer` in the run config"],
  train_env_vars: ["placement", "environment of slime's Ray train actors: set it in the trainer server's environment"],
  release_train: ["placement", "releases Megatron actors between phases (colocation memory)"],
  load: ["checkpoint", "rlq resumes a run from Postgres and its committed checkpoints"],
  ref_load: ["checkpoint", "a Megatron torch_dist checkpoint; a remote trainer starts from (and takes its reference from) hf_checkpoint"],
  ref_ckpt_step: ["checkpoint", "names a step of ref_load; the torch trainer starts from hf_checkpoint"],
  async_save: ["checkpoint", "Megatron's asynchronous save (speed only)"],
  no_save_optim: ["checkpoint", "rlq's checkpoints always carry the optimizer state"],
  no_load_optim: ["checkpoint", "rlq resumes with the optimizer state it committed"],
  no_load_rng: ["checkpoint", "rlq resumes with the state it committed"],
  ckpt_step: ["checkpoint", "rlq resumes at the run's last committed step"],
  save_hf: ["checkpoint", "the torch trainer's committed checkpoints are Hugging Face safetensors already"],
  use_fault_tolerance: ["runtime", "rlq always health-checks remote engines (rollout_health_check_*)"],
  http_proxy: ["runtime", "no proxy setting: rlq calls engines directly"],
  use_distributed_post: ["runtime", "no proxy setting: rlq calls engines directly"],
  rollout_data_transport: ["runtime", "samples travel as rows in Postgres"],
  update_weight_mode: ["runtime", "weights sync through weight_sync (disk or trainer_push)"],
  update_weight_transport: ["runtime", "weights sync through weight_sync (disk or trainer_push)"],
  update_weight_buffer_size: ["runtime", "weights sync through weight_sync (disk or trainer_push)"],
  update_weight_delta_encoding: ["runtime", "weights sync through weight_sync (disk or trainer_push)"],
  update_weight_delta_checksum: ["runtime", "weights sync through weight_sync; rlq verifies checkpoints by sha256"],
  update_weight_disk_dir: ["runtime", "weights sync through weight_sync: disk (checkpoint_dir on a shared filesystem)"],
  update_weight_disk_keep_files: ["runtime", "committed checkpoints are kept by save_interval"],
  update_weight_local_checkpoint_dir: ["runtime", "weights sync through weight_sync (disk or trainer_push)"],
  custom_update_weight_post_write_path: ["runtime", "weights sync through weight_sync (disk or trainer_push)"],
  check_weight_update_equal: ["debug", "rlq verifies weight syncs by checkpoint hash"],
  save_debug_rollout_data: [
    "debug",
    "every sample is a row already: a train-only run reads them with debug_rollouts_from: RUN_ID (rlq export RUN --format jsonl for files)",
  ],
  save_debug_train_data: ["debug", "train batches are rebuilt from facts (rlq retrain)"],
  dump_details: ["debug", "every sample is a row already: rlq export RUN --format jsonl"],
  record_memory_history: ["debug", "profiling belongs to the trainer's own tools"],
  memory_recorder: ["debug", "profiling belongs to the trainer's own tools"],
  memory_snapshot_dir: ["debug", "profiling belongs to the trainer's own tools"],
  memory_snapshot_num_steps: ["debug", "profiling belongs to the trainer's own tools"],
  profile_target: ["debug", "profiling belongs to the trainer's own tools"],
  ci_test: ["debug", "slime's CI only"],
  ci_disable_kl_checker: ["debug", "slime's CI only"],
  ci_load_grad_norm: ["debug", "slime's CI only"],
  ci_save_grad_norm: ["debug", "slime's CI only"],
  ci_train_rollout_logprob_abs_diff_threshold: ["debug", "slime's CI only (rlq reports train_rollout_logprob_abs_diff as a metric)"],
  custom_rollout_log_function_path: ["logging", "metrics are rows in Postgres (rlq sql) and go to tensorboard_dir / W&B"],
  custom_eval_rollout_log_function_path: ["logging", "eval metrics are rows in Postgres (rlq sql)"],
  log_multi_turn: ["logging", "every turn is a row (rlq export)"],
  log_passrate: ["logging", "pass@k is reported for evals (eval_pass_k)"],
  log_correct_samples: ["logging", "every sample and its reward is a row (rlq export)"],
  log_reward_category: ["logging", "reward components are stored per sample"],
  use_tensorboard: ["logging", "set tensorboard_dir to write TensorBoard events"],
  tb_project_name: ["logging", "rlq writes <tensorboard_dir>/<run id>"],
  tb_experiment_name: ["logging", "rlq writes <tensorboard_dir>/<run id>"],
  wandb_run_id: ["logging", "rlq names the W&B run by the run id"],
  wandb_always_use_train_step: ["logging", "rlq logs by train step"],
  disable_wandb_random_suffix: ["logging", "rlq names the W&B run by the run id"],
  rollout_num_gpus_per_engine: ["sglang", "the server's --tp-size"],
  prefill_num_servers: ["sglang", "PD disaggregation: start prefill and decode servers behind a PD router, and set engine.router_url"],
  sglang_config: ["sglang", "slime's SGLang deployment YAML: start the servers it describes yourself"],
  worker_urls: ["router", "the router's --worker-urls"],
};

/** Placement: what slime does with the GPUs. Named in the import report with what it changes. */
const placementNames = new Set([
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
  "no_offload_train",
  "no_offload_rollout",
]);

/** Megatron flags rlq reads under slime's name (Megatron declares them; slime resets some defaults). */
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
  "eval_interval",
  "calculate_per_token_loss",
]);

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
 * The disposition the table gives slime's flag `key` (snake_case), or null
 * when the table has none (then it is not one of slime's declared flags).
 */
export function declaredDisposition(key: string, rlqKeys: ReadonlySet<string>): FlagDisposition | null {
  if (key === "custom_config_path") return { kind: "read", note: "its YAML's settings are imported as if given on the command line" };
  if (key === "eval_config") return { kind: "read", note: "its datasets become eval_prompt_data entries, each with its overrides" };
  const r = renamed[key];
  if (r) return { kind: "renamed", ...r };
  const u = unsupported[key];
  if (u) return { kind: "unsupported", ...u };
  const d = dropped[key];
  if (d) return { kind: "dropped", group: d[0], note: d[1] };
  if (placementNames.has(key)) return { kind: "dropped", group: "placement", note: placementNote(key) };
  if (rlqKeys.has(key) || megatronKept.has(key)) {
    const difference = differences[key];
    return difference === undefined ? { kind: "same" } : { kind: "same", difference };
  }
  if (key.startsWith("sglang_")) return { kind: "dropped", group: "sglang", note: `the server's --${key.slice(7).replace(/_/g, "-")}` };
  if (key.startsWith("router_")) return { kind: "dropped", group: "router", note: `the router's --${key.slice(7).replace(/_/g, "-")}` };
  return null;
}

function placementNote(key: string): string {
  if (key === "colocate")
    return "slime shares the actor's GPUs with SGLang and offloads each between phases; in rlq the trainer and the engines need GPUs of their own";
  if (key.includes("offload")) return "offloading between phases serves colocation; rlq's trainer and engines stay resident on GPUs of their own";
  return "how many GPUs slime's Ray job uses: start the trainer and the SGLang servers on that many yourself";
}

/** Megatron flags slime's scripts pass (model shape, parallelism, kernels, precision, optimizer offload). */
const megatronPattern =
  /^(tensor_model_parallel|pipeline_model_parallel|context_parallel|expert_|sequence_parallel|recompute_|attention_|hidden_dropout|moe_|num_layers|num_experts|hidden_size|ffn_hidden_size|num_attention_heads|group_query_attention|num_query_groups|kv_channels|qk_layernorm|swiglu|normalization|norm_epsilon|rotary_|use_rotary|disable_bias_linear|vocab_size|untie_embeddings|position_embedding|make_vocab_size|bf16|fp16|fp8|accumulate_allreduce|optimizer_|overlap_|use_precision_aware|use_distributed_optimizer|transformer_impl|megatron_|custom_megatron_|calculate_per_token_loss_|use_flash_attn|max_position_embeddings|seq_length|tokenizer_type|add_qkv_bias|kv_lora_rank|q_lora_rank|qk_head_dim|qk_pos_emb_head_dim|v_head_dim|multi_latent_attention|mtp_|enable_mtp|mscale|spec$|no_masked_softmax_fusion|no_rope_fusion|no_gradient_accumulation_fusion|post_mlp_layernorm|post_self_attn_layernorm|apply_layernorm_1p|init_method_std)/;

/** A Megatron model-shape, parallelism, kernel or precision flag (which slime does not declare). */
export function isMegatronShapeFlag(key: string): boolean {
  return megatronPattern.test(key);
}

/**
 * The disposition of slime's flag `key` (snake_case, no dashes). `rlqKeys`
 * are the run config's own keys. A flag the table does not know is
 * Megatron's: model shape and parallelism are dropped (the trainer owns
 * them); any other is `unsupported`, since whether it changes the run is
 * not known here.
 */
export function classifySlimeFlag(key: string, rlqKeys: ReadonlySet<string>): FlagDisposition {
  const d = declaredDisposition(key, rlqKeys);
  if (d !== null) return d;
  if (megatronPattern.test(key)) return { kind: "dropped", group: "megatron", note: "" };
  return {
    kind: "unsupported",
    why: "not one of slime's flags at 624b824, so Megatron's parser takes it, and rlq cannot tell whether it changes the run",
    instead: "check what it does in Megatron; if it only shapes parallelism or kernels, drop it",
  };
}

/**
 * What to write instead of an unknown run-config key that is one of slime's
 * flags (null: not a slime flag rlq knows of). Used in the "unknown key" error.
 */
export function unknownKeyHint(key: string, rlqKeys: ReadonlySet<string>): string | null {
  const d = declaredDisposition(key, rlqKeys) ?? (megatronPattern.test(key) ? classifySlimeFlag(key, rlqKeys) : null);
  if (d === null) return null;
  switch (d.kind) {
    case "same":
      return null;
    case "read":
      return "the importer reads it (rlq config import-slime): write its settings as keys";
    case "renamed":
      return d.value === undefined ? `write ${d.key} instead (${d.note})` : `write ${d.key}: ${JSON.stringify(d.value)} instead (${d.note})`;
    case "dropped":
      return `drop it: ${dropGroupTitles[d.group]}${d.note === "" ? "" : `; ${d.note}`}`;
    case "unsupported":
      return `rlq does not support it: ${d.why}; instead: ${d.instead}`;
  }
}
