import { readFile } from "node:fs/promises";
import { sha256Hex } from "../lib/hash.ts";
import { RlqError } from "../lib/errors.ts";

/**
 * Prompt datasets (JSONL). A bad row is reported with its line number and
 * skipped; the rest of the dataset stays usable. The fingerprint is the
 * sha256 of the file bytes: a run refuses to resume if it changed.
 */
export interface PromptRow {
  /** Index among the valid rows: what the cursor permutes. */
  index: number;
  line: number;
  prompt: string;
  label: string | null;
  metadata: Record<string, unknown>;
}

export interface Dataset {
  path: string;
  fingerprint: string;
  rows: PromptRow[];
  errors: string[];
}

export interface DatasetKeys {
  input_key: string;
  label_key: string | null;
  metadata_key: string;
}

export async function loadJsonlDataset(path: string, keys: DatasetKeys): Promise<Dataset> {
  let bytes: Buffer;
  try {
    bytes = await readFile(path);
  } catch (e) {
    throw new RlqError("dataset_missing", `prompt_data ${path}: ${(e as Error).message}`);
  }
  const rows: PromptRow[] = [];
  const errors: string[] = [];
  const lines = bytes.toString("utf8").split("\n");
  for (let i = 0; i < lines.length; i++) {
    const text = (lines[i] as string).trim();
    if (text === "") continue;
    const where = `${path}:${i + 1}`;
    let obj: unknown;
    try {
      obj = JSON.parse(text);
    } catch (e) {
      errors.push(`${where}: not valid JSON (${(e as Error).message})`);
      continue;
    }
    if (obj === null || typeof obj !== "object" || Array.isArray(obj)) {
      errors.push(`${where}: expected a JSON object, got ${Array.isArray(obj) ? "an array" : typeof obj}`);
      continue;
    }
    const rec = obj as Record<string, unknown>;
    const prompt = rec[keys.input_key];
    if (typeof prompt !== "string" || prompt.length === 0) {
      errors.push(`${where}: input_key '${keys.input_key}' must be a non-empty string, got ${JSON.stringify(prompt) ?? "nothing"}`);
      continue;
    }
    const rawLabel = keys.label_key === null ? undefined : rec[keys.label_key];
    const label = rawLabel === undefined || rawLabel === null ? null : typeof rawLabel === "string" ? rawLabel : JSON.stringify(rawLabel);
    const meta = rec[keys.metadata_key];
    if (meta !== undefined && (meta === null || typeof meta !== "object" || Array.isArray(meta))) {
      errors.push(`${where}: metadata_key '${keys.metadata_key}' must be an object, got ${JSON.stringify(meta)}`);
      continue;
    }
    rows.push({ index: rows.length, line: i + 1, prompt, label, metadata: (meta as Record<string, unknown> | undefined) ?? {} });
  }
  if (rows.length === 0) {
    throw new RlqError("dataset_empty", `prompt_data ${path}: no usable rows${errors.length ? ` (${errors.length} bad: ${errors.slice(0, 3).join("; ")})` : ""}`);
  }
  return { path, fingerprint: sha256Hex(bytes), rows, errors };
}
