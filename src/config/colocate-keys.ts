/**
 * Colocated mode (slime's --colocate, --offload-train, --offload-rollout; slime/utils/arguments.py):
 * the trainer and the engines share GPUs and take turns, each releasing its memory while the
 * other runs. The keys parse and resolve here; the run itself (its phases as decisions in the
 * event log) is refused until the controller runs those phases, so a config that asks for it
 * never starts a run that would silently keep both resident.
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
}

/** What offloading is in force: an unset flag follows colocate, as slime's argument checks resolve it. */
export function effectiveOffload(c: Omit<ColocateRuleInput, "train_async">): { train: boolean; rollout: boolean } {
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
  if (c.colocate && !c.train_async)
    issue(
      "colocate",
      "colocate: true is not run by rlq yet (its phases, rollout, engines released, train, push, engines resumed, are not built): set colocate: false and start the trainer and the engines on GPUs of their own",
    );
}
