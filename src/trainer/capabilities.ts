import { z } from "zod";
import { RlqError } from "../lib/errors.ts";

/**
 * What a remote trainer declares it can do, in its `/v1/health` answer
 * (`capabilities`, docs/trainer-protocol.md). A trainer that declares nothing
 * can do nothing optional: protocol v1 trainers predate the field.
 */
export const trainerCapabilitiesSchema = z
  .object({
    /** A value model: `advantage_estimator: ppo` (GAE, value loss with value_clip, critic checkpoints). */
    critic: z.boolean().default(false),
    /** LoRA adapters on a Hugging Face model: `lora_rank` > 0 (workers/trainer-torch/rlq_torch/lora.py). */
    lora: z.boolean().default(false),
  })
  .passthrough();
export type TrainerCapabilities = z.infer<typeof trainerCapabilitiesSchema>;

const healthSchema = z.object({ capabilities: trainerCapabilitiesSchema.optional() }).passthrough();

/** The capabilities a run config needs from its trainer. */
export function requiredCapabilities(config: Record<string, unknown>): Array<keyof TrainerCapabilities> {
  const needed: Array<keyof TrainerCapabilities> = config.advantage_estimator === "ppo" ? ["critic"] : [];
  if (typeof config.lora_rank === "number" && config.lora_rank > 0) needed.push("lora");
  return needed;
}

/**
 * Refuses (non-retriable `trainer_unsupported`) a config that needs what the
 * trainer at `where` does not declare: retrying cannot help, so the run pauses
 * with this message until the config or the trainer changes.
 */
export function checkTrainerCapabilities(health: unknown, config: Record<string, unknown>, where: string): void {
  const needed = requiredCapabilities(config);
  if (needed.length === 0) return;
  const parsed = healthSchema.safeParse(health);
  const caps: Record<string, unknown> = parsed.success ? (parsed.data.capabilities ?? {}) : {};
  for (const cap of needed) {
    if (caps[cap] === true) continue;
    if (cap === "critic") {
      throw new RlqError(
        "trainer_unsupported",
        `advantage_estimator: ppo needs a critic, and the trainer at ${where} does not declare one (its /v1/health has no capabilities.critic: true). ` +
          "Use workers/trainer-torch/server.py (it trains a value model for rlq's embedded models and Hugging Face models), or choose another advantage_estimator (grpo, gspo, reinforce_plus_plus, ...)",
        { isRetriable: false },
      );
    }
    throw new RlqError("trainer_unsupported", `the trainer at ${where} does not declare capabilities.${cap}, which this run's config needs`, {
      isRetriable: false,
    });
  }
}
