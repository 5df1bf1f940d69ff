/**
 * slime's `--eval-config` YAML (slime/utils/eval_config.py): `eval: {defaults: {...}, datasets: [...]}`,
 * each dataset `{name, path, ...overrides}` (or a mapping keyed by name), a field the dataset leaves
 * empty taken from `defaults` (`EvalDatasetConfig.apply_defaults`). Read into rlq's
 * `eval_prompt_data: {name: {path, ...overrides}}` (config/eval-datasets.ts); a field rlq has no
 * counterpart for is reported, never dropped unsaid.
 */

import { parse as parseYaml } from "yaml";

/** slime's field → rlq's (prompt_key is an older spelling of input_key in slime's dataclass). */
const fields: Record<string, string> = {
  path: "path",
  rm_type: "rm_type",
  input_key: "input_key",
  prompt_key: "input_key",
  label_key: "label_key",
  tool_key: "tool_key",
  metadata_key: "metadata_key",
  metadata_overrides: "metadata_overrides",
  n_samples_per_eval_prompt: "n_samples_per_eval_prompt",
  temperature: "temperature",
  top_p: "top_p",
  top_k: "top_k",
  max_response_len: "max_response_len",
  apply_chat_template: "apply_chat_template",
  apply_chat_template_kwargs: "apply_chat_template_kwargs",
};

/** slime's `_EMPTY_VALUES`: what `apply_defaults` fills. */
const isEmpty = (v: unknown) =>
  v === null ||
  v === undefined ||
  (Array.isArray(v) && v.length === 0) ||
  (typeof v === "object" && v !== null && !Array.isArray(v) && Object.keys(v).length === 0);

export interface EvalConfigRead {
  datasets: Record<string, Record<string, unknown>>;
  /** Fields rlq has no counterpart for: `{dataset, field}` (defaults included, as they reach every dataset). */
  unsupported: Array<{ dataset: string; field: string }>;
}

/** The datasets of an eval YAML, or the reason it cannot be read. */
export function readSlimeEvalConfig(path: string, text: string | null): EvalConfigRead | string {
  if (text === null) return `cannot read ${path}`;
  let data: unknown;
  try {
    data = parseYaml(text) ?? {};
  } catch (e) {
    return `${path} is not YAML: ${(e as Error).message.split("\n")[0]}`;
  }
  const obj = (v: unknown): Record<string, unknown> | null =>
    v !== null && typeof v === "object" && !Array.isArray(v) ? (v as Record<string, unknown>) : null;
  const root = obj(data);
  const evalBlock = obj(root?.eval) ?? root;
  if (evalBlock === null) return `${path}: expected a mapping with eval: {defaults, datasets}`;
  const defaults = obj(evalBlock.defaults) ?? {};
  const raw = evalBlock.datasets;
  let list: Array<Record<string, unknown>>;
  if (Array.isArray(raw)) {
    list = [];
    for (const [i, item] of raw.entries()) {
      const d = obj(item);
      if (d === null || typeof d.name !== "string")
        return `${path}: eval.datasets[${i}] needs a name (slime: "Each evaluation dataset entry must include a \`name\` field")`;
      list.push(d);
    }
  } else if (obj(raw) !== null) {
    list = Object.entries(obj(raw) as Record<string, unknown>).map(([name, d]) => ({ name, ...(obj(d) ?? {}) }));
  } else {
    return `${path}: eval.datasets must be a list of {name, path, ...} or a mapping keyed by name`;
  }
  const out: EvalConfigRead = { datasets: {}, unsupported: [] };
  for (const d of list) {
    const name = d.name as string;
    const merged: Record<string, unknown> = { ...d };
    for (const [k, v] of Object.entries(defaults)) if (isEmpty(merged[k])) merged[k] = v;
    const entry: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(merged)) {
      if (k === "name" || isEmpty(v)) continue;
      const to = fields[k];
      if (to === undefined) out.unsupported.push({ dataset: name, field: k });
      else entry[to] = v;
    }
    out.datasets[name] = entry;
  }
  return out;
}
