/**
 * Eval datasets as slime names them (slime/utils/eval_config.py `EvalDatasetConfig`): each entry of
 * `eval_prompt_data` is a path, or a path with per-dataset overrides. A field the dataset leaves
 * out falls back to the run's `eval_*` key, then to its rollout counterpart, in slime's order
 * (dataset, then eval defaults, then the rollout flags: `resolveEvalDatasets`).
 */

import { z } from "zod";

export const evalDatasetSchema = z.strictObject({
  path: z.string().min(1),
  input_key: z.string().min(1).optional(),
  label_key: z.string().min(1).nullable().optional(),
  tool_key: z.string().min(1).optional(),
  metadata_key: z.string().min(1).optional(),
  /** slime: written into each sample's metadata, where the reward's rm_type choice reads it (reward/registry.ts). */
  rm_type: z.string().min(1).optional(),
  metadata_overrides: z.record(z.string(), z.unknown()).optional(),
  n_samples_per_eval_prompt: z.number().int().positive().optional(),
  temperature: z.number().positive().optional(),
  top_p: z.number().gt(0).max(1).optional(),
  top_k: z.number().int().optional(),
  max_response_len: z.number().int().positive().optional(),
  apply_chat_template: z.boolean().optional(),
  apply_chat_template_kwargs: z.record(z.string(), z.unknown()).optional(),
});

export type EvalDatasetEntry = string | z.infer<typeof evalDatasetSchema>;

/** One entry of eval_prompt_data: a path, or a path with overrides; the overrides' issues keep their own paths. */
export const evalDatasetEntrySchema = z.unknown().transform((v, ctx): EvalDatasetEntry => {
  if (typeof v === "string" && v.length > 0) return v;
  if (v === null || typeof v !== "object" || Array.isArray(v)) {
    ctx.addIssue({ code: "custom", message: "expected a dataset path, or {path, ...overrides} (input_key, label_key, rm_type, temperature, ...)" });
    return z.NEVER;
  }
  const r = evalDatasetSchema.safeParse(v);
  if (r.success) return r.data;
  for (const i of r.error.issues) ctx.addIssue({ code: "custom", message: i.message, path: i.path });
  return z.NEVER;
});

/** What resolution reads of a run config (a structural subset of RunConfig, so this module stays below it). */
export interface EvalDatasetDefaults {
  eval_prompt_data: Record<string, EvalDatasetEntry> | null;
  input_key: string;
  label_key: string | null;
  tool_key: string;
  metadata_key: string;
  eval_input_key: string | null;
  eval_label_key: string | null;
  eval_tool_key: string | null;
  n_samples_per_eval_prompt: number;
  eval_temperature: number | null;
  eval_top_p: number | null;
  eval_top_k: number | null;
  eval_max_response_len: number | null;
  rollout_temperature: number;
  rollout_top_p: number;
  rollout_top_k: number;
  rollout_max_response_len: number;
  apply_chat_template: boolean;
  apply_chat_template_kwargs: Record<string, unknown>;
  eval_apply_chat_template_kwargs: Record<string, unknown> | null;
  eval_max_prompt_len: number | null;
}

/** One eval dataset with every setting decided. */
export interface EvalDataset {
  name: string;
  path: string;
  keys: { input_key: string; label_key: string | null; tool_key: string; metadata_key: string };
  rmType: string | null;
  metadataOverrides: Record<string, unknown>;
  n: number;
  temperature: number;
  topP: number;
  topK: number;
  maxResponseLen: number;
  applyChatTemplate: boolean;
  chatTemplateKwargs: Record<string, unknown>;
  maxPromptLen: number | null;
}

export function resolveEvalDatasets(c: EvalDatasetDefaults): EvalDataset[] {
  return Object.entries(c.eval_prompt_data ?? {}).map(([name, entry]) => {
    const d = typeof entry === "string" ? { path: entry } : entry;
    return {
      name,
      path: d.path,
      keys: {
        input_key: d.input_key ?? c.eval_input_key ?? c.input_key,
        label_key: d.label_key !== undefined ? d.label_key : (c.eval_label_key ?? c.label_key),
        tool_key: d.tool_key ?? c.eval_tool_key ?? c.tool_key,
        metadata_key: d.metadata_key ?? c.metadata_key,
      },
      rmType: d.rm_type ?? null,
      metadataOverrides: d.metadata_overrides ?? {},
      n: d.n_samples_per_eval_prompt ?? c.n_samples_per_eval_prompt,
      temperature: d.temperature ?? c.eval_temperature ?? c.rollout_temperature,
      topP: d.top_p ?? c.eval_top_p ?? c.rollout_top_p,
      topK: d.top_k ?? c.eval_top_k ?? c.rollout_top_k,
      maxResponseLen: d.max_response_len ?? c.eval_max_response_len ?? c.rollout_max_response_len,
      applyChatTemplate: d.apply_chat_template ?? c.apply_chat_template,
      chatTemplateKwargs: d.apply_chat_template_kwargs ?? c.eval_apply_chat_template_kwargs ?? c.apply_chat_template_kwargs,
      maxPromptLen: c.eval_max_prompt_len,
    };
  });
}

/** slime `EvalDatasetConfig.inject_metadata`: the dataset's rm_type, then its overrides, over the row's metadata. */
export function evalSampleMetadata(d: EvalDataset, metadata: unknown): Record<string, unknown> {
  const out: Record<string, unknown> = metadata !== null && typeof metadata === "object" && !Array.isArray(metadata) ? { ...metadata } : {};
  if (d.rmType !== null) out.rm_type = d.rmType;
  return { ...out, ...d.metadataOverrides };
}
