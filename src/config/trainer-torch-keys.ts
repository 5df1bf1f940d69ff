/**
 * Run-config keys read by the PyTorch trainer (workers/trainer-torch, docs/trainer-torch.md),
 * slime's names where slime has one. The embedded trainer ignores them (it has no packing,
 * no critic and no Hugging Face output); rlq refuses `advantage_estimator: ppo` unless the
 * configured trainer declares a critic (src/trainer/capabilities.ts).
 */

import { z } from "zod";

export const trainerTorchKeys = {
  /** slime's --use-dynamic-batch-size: pack each micro-batch into one row, up to max_tokens_per_gpu tokens. */
  use_dynamic_batch_size: z.boolean().default(false),
  /** slime's --num-critic-only-steps: the first N rollout steps train the critic only (ppo). */
  num_critic_only_steps: z.number().int().nonnegative().default(0),
  /** The critic's learning rate (slime's --critic-lr); null: lr. */
  critic_lr: z.number().positive().nullable().default(null),
  /** Recompute activations in the backward instead of keeping them (less memory, ~1/3 more compute). */
  gradient_checkpointing: z.boolean().default(false),
  /** Hugging Face output dtype; null: the model's own torch_dtype. */
  hf_save_dtype: z.enum(["bf16", "fp16", "fp32"]).nullable().default(null),
};

/**
 * Tensor and context parallel in the torch trainer (slime's Megatron names; docs/trainer-torch.md,
 * workers/trainer-torch/rlq_torch/tensor_parallel.py): a (dp, cp, tp) device mesh with FSDP2 over dp·cp.
 */
export const trainerTorchParallelKeys = {
  /** slime's --tensor-model-parallel-size: ranks that split each decoder layer (DTensor parallelize_module). */
  tensor_model_parallel_size: z.number().int().positive().default(1),
  /** slime's --context-parallel-size: ranks that split each sequence (ring attention; CUDA only). */
  context_parallel_size: z.number().int().positive().default(1),
  /** slime's --sequence-parallel: with tensor_model_parallel_size > 1, the norms are cut along the sequence too. */
  sequence_parallel: z.boolean().default(false),
};

/**
 * LoRA RL on a Hugging Face model through peft (docs/trainer-torch.md, workers/trainer-torch/rlq_torch/lora.py),
 * verl's names (actor_rollout_ref.model.lora_rank / lora_alpha / target_modules). Only the adapters train; engines
 * load the merged weights at every version (or, with lora_sync: adapter on vLLM, the adapter alone), and each checkpoint holds the adapter in peft's layout (adapter/).
 */
export const trainerTorchLoraKeys = {
  /** The adapters' rank; 0: LoRA off (a full fine-tune). */
  lora_rank: z.number().int().nonnegative().default(0),
  /** peft's lora_alpha: the adapters' delta is scaled by lora_alpha / lora_rank; null: 16. */
  lora_alpha: z.number().positive().nullable().default(null),
  /** peft's lora_dropout on the adapters' input; null: 0. */
  lora_dropout: z.number().min(0).lt(1).nullable().default(null),
  /** The modules that get adapters: "all-linear" (every linear layer but the output head) or module names; null: all-linear. */
  target_modules: z
    .union([z.literal("all-linear"), z.array(z.string().min(1)).min(1)])
    .nullable()
    .default(null),
};

interface LoraConfigView {
  lora_rank: number;
  lora_alpha: number | null;
  lora_dropout: number | null;
  target_modules: "all-linear" | string[] | null;
  hf_checkpoint: string | null;
  tensor_model_parallel_size: number;
  trainer: { kind: string };
  lora_sync: "merged" | "adapter";
  weight_sync: string;
  engine: { kind: string };
}

/** The LoRA keys' refusals, each naming the key and what to write instead (the torch trainer repeats them: lora.py). */
export function refineLora(c: LoraConfigView, ctx: z.RefinementCtx): void {
  refineLoraSync(c, ctx);
  const set = (["lora_alpha", "lora_dropout", "target_modules"] as const).filter((k) => c[k] !== null);
  if (c.lora_rank === 0) {
    for (const k of set) {
      ctx.addIssue({ code: "custom", path: [k], message: `${k} is set but lora_rank is 0 (LoRA off): set lora_rank (e.g. 8) or drop ${k}` });
    }
    return;
  }
  if (c.hf_checkpoint === null) {
    ctx.addIssue({
      code: "custom",
      path: ["lora_rank"],
      message: "lora_rank needs a Hugging Face model (hf_checkpoint): rlq's embedded model has no peft LoRA; set hf_checkpoint or lora_rank: 0",
    });
  }
  if (c.trainer.kind === "embedded") {
    ctx.addIssue({
      code: "custom",
      path: ["lora_rank"],
      message:
        "lora_rank needs the torch trainer (trainer: {kind: remote, url: ...} served by workers/trainer-torch/server.py); the embedded trainer trains every weight",
    });
  }
  if (c.tensor_model_parallel_size > 1) {
    ctx.addIssue({
      code: "custom",
      path: ["lora_rank"],
      message: "lora_rank with tensor_model_parallel_size > 1 is not supported: use FSDP (--sharding fsdp) for LoRA, or lora_rank: 0",
    });
  }
}

/**
 * lora_sync adapter needs an adapter to send, a disk sync to send it by, and an engine that loads adapters by name:
 * rlq's vLLM adapter does (src/engines/openai-compat.ts), its SGLang adapter does not, and the embedded engine has no LoRA.
 */
function refineLoraSync(c: LoraConfigView, ctx: z.RefinementCtx): void {
  if (c.lora_sync !== "adapter") return;
  const issue = (message: string) => ctx.addIssue({ code: "custom", path: ["lora_sync"], message });
  if (c.lora_rank === 0) issue("lora_sync: adapter needs a LoRA run: set lora_rank (e.g. 8), or drop lora_sync (merged, the default)");
  if (c.weight_sync !== "disk")
    issue(
      `lora_sync: adapter with weight_sync: ${c.weight_sync}: the adapter is loaded from each committed checkpoint's adapter/ directory, a disk sync; set weight_sync: disk or lora_sync: merged`,
    );
  if (c.engine.kind === "sglang")
    issue(
      "lora_sync: adapter with engine.kind sglang: rlq's SGLang adapter does not load LoRA adapters (it loads full weights through update_weights_from_disk); use lora_sync: merged, or a vLLM engine (engine.kind: openai)",
    );
  else if (c.engine.kind !== "openai")
    issue(
      `lora_sync: adapter with engine.kind ${c.engine.kind}: this engine has no LoRA loading; use lora_sync: merged, or a vLLM engine (engine.kind: openai)`,
    );
}
