/**
 * Run-config keys of the metric sinks (slime's flag names, snake_case),
 * spread into the run config schema (config/run-config.ts).
 * - `tensorboard_dir`: slime takes TENSORBOARD_DIR / tb_project_name; rlq writes
 *   `<tensorboard_dir>/<run id>/events.out.tfevents.*` (relative to RLQ_HOME when relative),
 *   so several runs can share one TensorBoard logdir.
 * - `use_wandb`, `wandb_project`, `wandb_group`, `wandb_team` (the entity), `wandb_host`,
 *   `wandb_key` (a reference: {env: NAME} or {file: PATH}; never the key itself),
 *   `wandb_mode` (online | offline), `wandb_dir` (state and offline files; relative to RLQ_HOME).
 */

import { z } from "zod";
import { secretRefSchema } from "../../config/secrets.ts";
import { registerSecret } from "../../lib/redact.ts";

export const metricExportKeys = {
  tensorboard_dir: z.string().min(1).nullable().default(null),
  use_wandb: z.boolean().default(false),
  wandb_project: z.string().min(1).nullable().default(null),
  wandb_group: z.string().min(1).nullable().default(null),
  wandb_team: z.string().min(1).nullable().default(null),
  wandb_host: z.string().url().default("https://api.wandb.ai"),
  wandb_key: z
    .preprocess((v, ctx) => {
      if (typeof v !== "string") return v;
      // Someone pasted the key itself: hide it from the error message, and say what to write.
      registerSecret(v);
      ctx.addIssue({ code: "custom", message: "wandb_key is a reference, not the key: write wandb_key: {env: WANDB_API_KEY} (or {file: /run/secrets/wandb})" });
      return z.NEVER;
    }, secretRefSchema.nullable())
    .default(null),
  wandb_mode: z.enum(["online", "offline"]).default("online"),
  wandb_dir: z.string().min(1).default("wandb"),
};

export type MetricExportConfig = { [K in keyof typeof metricExportKeys]: z.infer<(typeof metricExportKeys)[K]> };

/** Cross-field checks, called from the run config's superRefine. */
export function refineMetricExport(c: MetricExportConfig, ctx: z.RefinementCtx): void {
  if (c.use_wandb && c.wandb_project === null)
    ctx.addIssue({ code: "custom", path: ["wandb_project"], message: "use_wandb needs wandb_project (the W&B project to log to)" });
  if (c.use_wandb && c.wandb_mode === "online" && c.wandb_key === null)
    ctx.addIssue({ code: "custom", path: ["wandb_key"], message: "use_wandb with wandb_mode online needs wandb_key: {env: WANDB_API_KEY}" });
}
