import { readFile } from "node:fs/promises";
import { sha256Hex } from "../lib/hash.ts";
import { RlqError } from "../lib/errors.ts";
import { promptRowFromRecord, withImageDir, type PromptRecordKeys } from "./chat-template.ts";
import type { PromptDatasetOptions } from "./parquet.ts";
import type { Dataset, PromptRow } from "./prompt-row.ts";

/**
 * Prompt datasets (JSONL). A bad row is reported with its line number and
 * skipped; the rest of the dataset stays usable. The fingerprint is the
 * sha256 of the file bytes: a run refuses to resume if it changed.
 */
export type { Dataset, DatasetKeys, PromptRow } from "./prompt-row.ts";

export async function loadJsonlDataset(path: string, keys: PromptRecordKeys, options: PromptDatasetOptions = {}): Promise<Dataset> {
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
    const d = promptRowFromRecord(obj as Record<string, unknown>, i + 1, keys, withImageDir(path, options));
    if (!d.ok) {
      if (options.isBadRowFatal) throw new RlqError("dataset_bad_row", `${where}: ${d.error}`);
      errors.push(`${where}: ${d.error}`);
      continue;
    }
    rows.push({ index: rows.length, ...d.value });
  }
  if (rows.length === 0) {
    throw new RlqError(
      "dataset_empty",
      `prompt_data ${path}: no usable rows${errors.length ? ` (${errors.length} bad: ${errors.slice(0, 3).join("; ")})` : ""}`,
    );
  }
  return { path, fingerprint: sha256Hex(bytes), rows, errors };
}

/** JSONL or Parquet, by file extension. */
export async function loadPromptData(path: string, keys: PromptRecordKeys, options: PromptDatasetOptions = {}): Promise<Dataset> {
  if (!/\.parquet$/i.test(path)) return loadJsonlDataset(path, keys, options);
  // Loaded on use: hyparquet is ~30 modules that every rlq start would pay for (bench/recovery.ts).
  const { isParquetPath, loadParquetDataset } = await import("./parquet.ts");
  return isParquetPath(path) ? loadParquetDataset(path, keys, options) : loadJsonlDataset(path, keys, options);
}
