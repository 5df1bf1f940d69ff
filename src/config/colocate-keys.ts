/**
 * Colocated mode (slime's --colocate, --offload-train, --offload-rollout; slime/utils/arguments.py):
 * the trainer and the engines share GPUs and take turns, each releasing its memory while the
 * other runs. The keys parse and resolve here; the controller runs the phases (rollout, engines
 * released, train, push, engines resumed) as decisions in the event log (core/colocate.ts).
 */

import { z } from "zod";

export const colocateKeys = {
  /** slime's --colocate: trainer and engines on the same GPUs, taking turns. */
  colocate: z.boolean().default(false),
  /** slime's --offload-train: the trainer moves its parameters and optimizer state off the GPU during rollouts. null: follows colocate. */
  offload_train: z.boolean().nullable().default(null),
  /** slime's --offload-rollout: the engines release weights and KV cache during training. null: follows colocate. */
  offload_rollout: z.boolean().nullable().default(null),
};

/** The parts of a run config the colocation rules read. */
interface ColocateRuleInput {
  colocate: boolean;
  offload_train: boolean | null;
  offload_rollout: boolean | null;
  train_async: boolean;
  engine: { kind: string };
  weight_sync: string;
  update_weights_interval: number;
}

/** What offloading is in force: an unset flag follows colocate, as slime's argument checks resolve it. */
export function effectiveOffload(c: Pick<ColocateRuleInput, "colocate" | "offload_train" | "offload_rollout">): { train: boolean; rollout: boolean } {
  return { train: c.offload_train ?? c.colocate, rollout: c.offload_rollout ?? c.colocate };
}

/** What colocation refuses; each message names the key, the value, and what to write instead. */
export function refineColocate(c: ColocateRuleInput, ctx: z.RefinementCtx): void {
  const issue = (path: string, message: string) => ctx.addIssue({ code: "custom", path: [path], message });
  if (c.colocate && c.train_async)
    // slime/train_async.py asserts the same: generation cannot overlap training on GPUs the trainer holds.
    issue(
      "train_async",
      "colocate: true takes turns on shared GPUs (the engines are released while the trainer trains), so generation cannot overlap training: set train_async: false, or colocate: false with GPUs of their own for the engines",
    );
  for (const key of ["offload_train", "offload_rollout"] as const) {
    if (c.colocate && c[key] === false)
      issue(key, `colocate: true needs both sides to release the shared GPUs (slime forces ${key} on under --colocate): remove ${key}: false`);
    if (!c.colocate && c[key] === true)
      issue(
        key,
        `${key} frees GPU memory for a colocated peer; with colocate: false the trainer and engines have GPUs of their own: remove ${key}, or set colocate: true`,
      );
  }
  if (!c.colocate) return;
  if (c.engine.kind === "embedded")
    issue(
      "engine",
      "colocate: true releases the engines' GPU memory through their servers' endpoints, and the embedded engine has no server: use engine kind sglang (or openai for vLLM with --enable-sleep-mode), or colocate: false",
    );
  if (c.weight_sync !== "disk")
    // Released weights hold nothing after a resume (SGLang frees them without a CPU copy), so each
    // step's trained version is loaded from its checkpoint between the two resumes.
    issue(
      "weight_sync",
      `colocate: true loads each step's checkpoint into the engines after their weights resume, so it needs weight_sync: disk, not ${JSON.stringify(c.weight_sync)}: set weight_sync: disk`,
    );
  if (c.update_weights_interval !== 1)
    issue(
      "update_weights_interval",
      `colocate: true releases the engines' weights every step, so they load the trained version every step: update_weights_interval ${c.update_weights_interval} cannot hold older weights across steps; remove it (1)`,
    );
}
