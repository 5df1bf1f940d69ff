import type { Db } from "../store/db.ts";
import { setRunProjection } from "../store/projections.ts";
import type { RunConfig } from "../config/run-config.ts";
import type { RunState } from "../core/run-state.ts";
import type { Dataset } from "../data/dataset.ts";
import { fingerprintFile, parsePluginPath } from "../plugins/load.ts";
import { isPythonSidecarPath, pythonPluginFile } from "../plugins/python.ts";
import { RlqError } from "../lib/errors.ts";

/** Config keys whose value may name a plugin module file. */
export const pluginKeys = [
  "custom_rm_path",
  "dynamic_sampling_filter_path",
  "buffer_filter_path",
  "custom_generate_function_path",
  "rollout_function_path",
] as const;

/** Plugin paths that are files (built-in names such as pop_first are not). */
export function pluginFiles(config: RunConfig): Record<string, string> {
  const out: Record<string, string> = {};
  for (const key of pluginKeys) {
    const v = config[key];
    // An HTTP plugin (http://...) has no file to fingerprint.
    if (typeof v !== "string" || /^https?:\/\//i.test(v)) continue;
    if (isPythonSidecarPath(v)) {
      // py:file.py:fn is fingerprinted like a JS module; a dotted module is found on the host's path at call time.
      const file = pythonPluginFile(v, process.cwd());
      if (file !== null) out[key] = file;
      continue;
    }
    if (v.includes("/") || /\.(m?[jt]s)$/.test(v)) out[key] = parsePluginPath(v, process.cwd()).file;
  }
  return out;
}

export async function fingerprintPlugins(config: RunConfig): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const [key, file] of Object.entries(pluginFiles(config))) out[key] = await fingerprintFile(file, key);
  return out;
}

/**
 * A run resumes only on the data and code it started with: a changed dataset
 * or plugin would silently change which prompts the draw ordinals mean.
 */
export async function checkFingerprints(db: Db, state: RunState, dataset: Dataset): Promise<void> {
  const problems: string[] = [];
  if (dataset.fingerprint !== state.datasetFingerprint) {
    problems.push(
      `prompt_data ${dataset.path} changed since the run started (sha256 ${state.datasetFingerprint.slice(0, 12)}… → ${dataset.fingerprint.slice(0, 12)}…)`,
    );
  }
  const now: Record<string, string> = await fingerprintPlugins(state.config).catch((e: Error) => {
    problems.push(e.message);
    return {};
  });
  for (const [key, fp] of Object.entries(state.pluginFingerprints)) {
    if (now[key] !== undefined && now[key] !== fp)
      problems.push(`${key} ${JSON.stringify(state.config[key as keyof RunConfig])} changed since the run started`);
  }
  if (problems.length > 0) {
    const message = `run ${state.runId} refuses to resume: ${problems.join("; ")}. Restore the original files, or start a new run.`;
    await setRunProjection(db, state.runId, { lastError: message });
    throw new RlqError("resume_refused", message);
  }
}
