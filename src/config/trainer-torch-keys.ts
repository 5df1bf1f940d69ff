import { z } from "zod";

/**
 * Run-config keys read by the PyTorch trainer (workers/trainer-torch, docs/trainer-torch.md),
 * slime's names where slime has one. The embedded trainer ignores them (it has no packing,
 * no critic and no Hugging Face output); rlq refuses `advantage_estimator: ppo` unless the
 * configured trainer declares a critic (src/trainer/capabilities.ts).
 */
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
