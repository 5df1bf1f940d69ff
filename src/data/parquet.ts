/**
 * Prompt datasets in Parquet (slime's `--prompt-data x.parquet`), read with
 * hyparquet (pure JS, no native code). Same shape and rules as the JSONL
 * loader: a bad row is reported as `path#row N` (1-based, stored in
 * `PromptRow.line`) and skipped, the rest stays usable; the fingerprint is the
 * sha256 of the file bytes.
 *
 * Column types: `input_key` a string or a list<struct<role, content>>
 * (message list, needs apply_chat_template); `label_key` any (non-strings are
 * stored as their JSON, INT64 included); `metadata_key` a struct/map or a JSON
 * string; `tool_key` a list or a JSON string. Compression: uncompressed and
 * snappy (what pandas/pyarrow write by default); other codecs fail with a
 * `dataset_invalid` naming the file. Images (multimodal_keys): a binary column
 * or a Hugging Face image struct<bytes: binary, path: string> (images.ts).
 */

import { readFile } from "node:fs/promises";
import { parquetMetadata, parquetReadObjects, parquetSchema } from "hyparquet";
import { sha256Hex } from "../lib/hash.ts";
import { RlqError } from "../lib/errors.ts";
import type { Dataset, PromptRow } from "./prompt-row.ts";
import { promptRowFromRecord, withImageDir, type PromptRecordKeys, type PromptRenderOptions } from "./chat-template.ts";

export interface PromptDatasetOptions extends PromptRenderOptions {
  /**
   * A bad row is skipped and reported (default), or, with true, fails the
   * whole load with `dataset_bad_row` naming the row.
   */
  isBadRowFatal?: boolean;
}

/** Whether `prompt_data` names a Parquet file (by extension, as slime does). */
export function isParquetPath(path: string): boolean {
  return /\.parquet$/i.test(path);
}

export async function loadParquetDataset(path: string, keys: PromptRecordKeys, options: PromptDatasetOptions = {}): Promise<Dataset> {
  let bytes: Buffer;
  try {
    bytes = await readFile(path);
  } catch (e) {
    throw new RlqError("dataset_missing", `prompt_data ${path}: ${(e as Error).message}`);
  }
  // A standalone ArrayBuffer: hyparquet slices it as its AsyncBuffer.
  const file = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength) as ArrayBuffer;
  let records: Array<Record<string, unknown>>;
  try {
    const metadata = parquetMetadata(file);
    const names = new Set(parquetSchema(metadata).children.map((c) => c.element.name));
    if (!names.has(keys.input_key)) {
      throw new RlqError("dataset_invalid", `prompt_data ${path}: no column input_key '${keys.input_key}' (columns: ${[...names].join(", ")})`);
    }
    // utf8: false: a binary column (an image's bytes) stays bytes; STRING/UTF8 columns are still text.
    records = (await parquetReadObjects({ file, metadata, utf8: false })) as Array<Record<string, unknown>>;
  } catch (e) {
    if (e instanceof RlqError) throw e;
    throw new RlqError("dataset_invalid", `prompt_data ${path}: not a readable Parquet file: ${(e as Error).message}`, { cause: e });
  }
  const rows: PromptRow[] = [];
  const errors: string[] = [];
  records.forEach((rec, i) => {
    const rowNumber = i + 1;
    const decoded = promptRowFromRecord(rec, rowNumber, keys, withImageDir(path, options));
    if (decoded.ok) {
      rows.push({ index: rows.length, ...decoded.value });
      return;
    }
    const message = `${path}#row ${rowNumber}: ${decoded.error}`;
    if (options.isBadRowFatal) throw new RlqError("dataset_bad_row", message);
    errors.push(message);
  });
  if (rows.length === 0) {
    throw new RlqError(
      "dataset_empty",
      `prompt_data ${path}: no usable rows${errors.length ? ` (${errors.length} bad: ${errors.slice(0, 3).join("; ")})` : ""}`,
    );
  }
  return { path, fingerprint: sha256Hex(bytes), rows, errors };
}
