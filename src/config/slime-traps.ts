/**
 * The places where a slime user's config would be accepted and then do
 * something else than in slime, or fail at first use. Each one either gets
 * slime's meaning here (`normalizeSlimeForms`) or is refused at validation
 * with what to write instead (`rawConfigIssues`, `parsedConfigIssues`).
 * Source read: THUDM/slime 624b824 (slime/utils/arguments.py).
 */

import { misKeys } from "../algorithms/mis.ts";
import { opdIssues, type OpdTeacher } from "./opd.ts";
import { builtinBufferFilter, builtinDynamicFilter } from "../filters/registry.ts";
import { nearest } from "../lib/nearest.ts";
import { slimeBuiltinDefaults, unknownKeyHint } from "./slime-flags.ts";

export interface ConfigIssue {
  path: string;
  message: string;
}

type Raw = Record<string, unknown>;
const isRecord = (v: unknown): v is Raw => v !== null && typeof v === "object" && !Array.isArray(v);

/** Engines that tokenize with the model's own tokenizer: a byte tokenizer sends them garbage. */
const remoteEngineKinds = new Set(["sglang", "openai"]);

function engineKind(raw: Raw): string {
  return isRecord(raw.engine) && typeof raw.engine.kind === "string" ? raw.engine.kind : "embedded";
}

/**
 * slime's forms that mean the same thing, rewritten before validation:
 * - `eval_prompt_data: "aime /data/aime.jsonl"` or `[aime, /data/aime.jsonl]`
 *   (slime's `--eval-prompt-data name path ...`) becomes `{aime: /data/aime.jsonl}`;
 * - `rollout_function_path: slime.rollout.sglang_rollout.generate_rollout` (slime's
 *   default) is rlq's own rollout loop, i.e. null;
 * - with a remote engine and `hf_checkpoint` set, a left-out `tokenizer` is `hf`
 *   (slime's GenerateState loads the tokenizer from --hf-checkpoint).
 */
export function normalizeSlimeForms(raw: unknown): unknown {
  if (!isRecord(raw)) return raw;
  const out: Raw = { ...raw };
  const evalData = out.eval_prompt_data;
  const words =
    typeof evalData === "string" ? evalData.trim().split(/\s+/) : Array.isArray(evalData) && evalData.every((w) => typeof w === "string") ? evalData : null;
  if (words !== null && words.length > 0 && words.length % 2 === 0) {
    const pairs: Raw = {};
    for (let i = 0; i < words.length; i += 2) pairs[words[i] as string] = words[i + 1];
    out.eval_prompt_data = pairs;
  }
  // slime's default rollout function is rlq's own loop: naming it is the same as leaving it out.
  if (typeof out.rollout_function_path === "string" && out.rollout_function_path.trim() === slimeBuiltinDefaults.rollout_function_path)
    out.rollout_function_path = null;
  if (out.tokenizer === undefined && typeof out.hf_checkpoint === "string" && out.hf_checkpoint !== "" && remoteEngineKinds.has(engineKind(out))) {
    out.tokenizer = "hf";
  }
  return out;
}

/** Checks that need to know which keys were written (after `normalizeSlimeForms`). */
export function rawConfigIssues(raw: unknown): ConfigIssue[] {
  if (!isRecord(raw)) return [];
  const issues: ConfigIssue[] = [];
  const kind = engineKind(raw);
  if (remoteEngineKinds.has(kind) && raw.tokenizer === undefined) {
    issues.push({
      path: "tokenizer",
      message: `engine.kind ${kind} serves a real model, and rlq's default byte tokenizer would send it byte ids and decode its answers to nothing: set hf_checkpoint to the model's Hugging Face directory (the tokenizer is then read from it, as slime does), or write tokenizer: bytes if the server really speaks rlq's byte ids (rlq's test fakes do)`,
    });
  }
  const evalData = raw.eval_prompt_data;
  if (typeof evalData === "string" || Array.isArray(evalData)) {
    issues.push({
      path: "eval_prompt_data",
      message: `slime's form is name/path pairs, e.g. "aime /data/aime-2024.jsonl" (or the mapping {aime: /data/aime-2024.jsonl}); ${typeof evalData === "string" ? `"${evalData}"` : JSON.stringify(evalData)} is not whole pairs`,
    });
  }
  const misWritten = misKeys.filter((k) => raw[k] !== undefined);
  if (misWritten.length > 0 && raw.tis_function !== "mis") {
    issues.push({
      path: misWritten[0] as string,
      message: `${misWritten.join(", ")} configure MIS, which runs only with tis_function: mis (slime: --custom-tis-function-path examples.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp); ${raw.tis_function === undefined ? "tis_function is left out, so vanilla TIS would run and ignore them" : `tis_function is ${JSON.stringify(raw.tis_function)}`}: add tis_function: mis, or remove them`,
    });
  }
  const steps = raw.num_steps_per_rollout;
  const gbs = raw.global_batch_size;
  const rbs = raw.rollout_batch_size;
  const n = raw.n_samples_per_prompt ?? 1;
  if (typeof steps === "number" && typeof gbs === "number" && typeof rbs === "number" && typeof n === "number" && steps > 0) {
    const derived = Math.floor((rbs * n) / steps);
    if (derived !== gbs) {
      issues.push({
        path: "global_batch_size",
        message: `global_batch_size ${gbs} disagrees with num_steps_per_rollout ${steps}: rollout_batch_size x n_samples_per_prompt / num_steps_per_rollout = ${rbs} x ${n} / ${steps} = ${derived} (slime asserts they agree); keep one of the two`,
      });
    }
  }
  return issues;
}

/** Plugin keys that name code; slime takes Python dotted paths there. */
const pluginKeys = ["custom_rm_path", "custom_generate_function_path", "rollout_function_path", "dynamic_sampling_filter_path", "buffer_filter_path"] as const;

/** `pkg.module.function` (what slime imports with importlib), or a `.py` file. */
export function isPythonPluginPath(path: string): boolean {
  const p = path.trim();
  // py: runs in rlq's Python plugin host (src/plugins/python.ts).
  if (/^https?:\/\//i.test(p) || p.startsWith("py:")) return false;
  if (/\.py(:[A-Za-z_]\w*)?$/.test(p)) return true;
  return /^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$/.test(p) && !/\.(ts|js|mjs|cjs|mts|cts)$/.test(p);
}

/** Keys whose `py:` functions rlq's Python plugin host runs (src/plugins/python.ts). */
export const pythonHostKeys: ReadonlySet<string> = new Set([
  "custom_rm_path",
  "dynamic_sampling_filter_path",
  "buffer_filter_path",
  "custom_generate_function_path",
]);

/** A `py:` value that the plugin host cannot run: on a key it does not serve, or not `py:pkg.module.fn` / `py:file.py:fn`. */
function pythonHostPathIssue(key: string, path: string): string | null {
  const p = path.trim();
  if (!p.startsWith("py:")) return null;
  if (!pythonHostKeys.has(key))
    return `rlq's Python plugin host runs custom_rm_path, dynamic_sampling_filter_path, buffer_filter_path and custom_generate_function_path; ${key} in Python is not run yet: write it in TS/JS or serve it over HTTP (docs/plugins.md)`;
  const rest = p.slice(3);
  if (/^.+\.py:[A-Za-z_]\w*$/.test(rest) || /^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$/.test(rest)) return null;
  return `expected py:package.module.function (importable from the worker's directory or PYTHONPATH) or py:path/to/file.py:function`;
}

interface TrapFields {
  custom_rm_path: string | null;
  custom_generate_function_path: string | null;
  rollout_function_path: string | null;
  dynamic_sampling_filter_path: string | null;
  buffer_filter_path: string | null;
  loss_mask_type: string;
  use_opd: boolean;
  opd_type: "sglang" | "megatron" | null;
  opd_teacher: OpdTeacher | null;
  advantage_estimator: string;
  trainer: { kind: string };
}

/**
 * The checks on parsed values. Run on configs as written only (parseRunConfig's
 * "user" origin), so a run stored before a check existed still loads.
 */
export function parsedConfigIssues(c: TrapFields): ConfigIssue[] {
  const issues: ConfigIssue[] = [];
  const issue = (path: string, message: string): void => {
    issues.push({ path, message });
  };
  for (const key of pluginKeys) {
    const path = c[key];
    if (path === null) continue;
    const pyIssue = pythonHostPathIssue(key, path);
    if (pyIssue !== null) issue(key, pyIssue);
    if (!isPythonPluginPath(path)) continue;
    if (key === "dynamic_sampling_filter_path" && builtinDynamicFilter(path) !== null) continue;
    if (key === "buffer_filter_path" && builtinBufferFilter(path) !== null) continue;
    issue(
      key,
      key === "rollout_function_path"
        ? `a Python path (slime imports it with importlib); rlq runs ${key} in TS/JS or over HTTP: name a TS/JS module and export, e.g. plugins/plugin.ts:fn, or an http(s):// URL served by your Python code (docs/plugins.md)`
        : `a Python path (slime imports it with importlib): write py:${path.trim()} to run it unmodified in rlq's Python plugin host, or name a TS/JS module and export, or an http(s):// URL (docs/plugins.md)`,
    );
  }
  if (c.loss_mask_type !== "qwen") {
    issue(
      "loss_mask_type",
      `slime uses loss_mask_type only to build SFT and rollout-buffer loss masks from chat transcripts (slime/rollout/sft_rollout.py); rlq's SFT runs (loss_type sft_loss, docs/sft.md) train prompt/response rows, whose response tokens all count, and RL masks come from generation (model tokens 1, tool tokens 0): remove loss_mask_type`,
    );
  }
  for (const [key, message] of opdIssues(c)) issue(key, message);
  if (c.advantage_estimator === "ppo" && c.trainer.kind === "embedded") {
    issue(
      "advantage_estimator",
      "ppo needs a critic (value model), and the embedded trainer has none: use grpo, gspo, cispo or reinforce_plus_plus(_baseline), or a remote trainer with critic support (trainer: {kind: remote, url: ...})",
    );
  }
  return issues;
}

/** The message after "unknown key(s)": what to write instead of each key. */
export function unknownKeyAdvice(keys: readonly string[], rlqKeys: ReadonlySet<string>): string {
  const parts: string[] = [];
  for (const key of keys) {
    const hint = unknownKeyHint(key, rlqKeys);
    if (hint !== null) {
      parts.push(`'${key}': ${hint}`);
      continue;
    }
    const near = nearest(key, rlqKeys);
    if (near !== null) parts.push(`'${key}': did you mean '${near}'?`);
  }
  return parts.join("; ");
}
