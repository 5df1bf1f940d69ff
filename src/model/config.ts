/**
 * The embedded model: a GPT-style causal transformer (pre-LN, tanh-GELU MLP,
 * learned absolute positions, untied output head, no dropout).
 *
 * Keys are snake_case because this object travels inside run configs and
 * checkpoint metadata, next to slime's flag names. The engine (ONNX), the
 * trainer (jax-js) and the float64 reference forward all build the same network
 * from this one object; changing a default here changes all three at once.
 */

import { z } from "zod";

export const modelConfigSchema = z
  .object({
    vocab_size: z.number().int().min(2).max(65_536),
    /** Maximum sequence length (prompt + response); also the KV-cache length. */
    context_length: z.number().int().min(2).max(4096),
    d_model: z.number().int().positive(),
    n_heads: z.number().int().positive(),
    n_layers: z.number().int().positive(),
    /** Hidden width of the MLP (GPT-2 uses 4 * d_model). */
    d_mlp: z.number().int().positive(),
    layer_norm_eps: z.number().positive().default(1e-5),
  })
  .refine((c) => c.d_model % c.n_heads === 0, {
    message: "d_model must be divisible by n_heads",
    path: ["n_heads"],
  });
export type ModelConfig = z.infer<typeof modelConfigSchema>;

/** Width of one attention head. */
export function headDim(config: ModelConfig): number {
  return config.d_model / config.n_heads;
}

/** Parse and fill defaults; throws a zod error naming the bad field. */
export function parseModelConfig(value: unknown): ModelConfig {
  return modelConfigSchema.parse(value);
}
