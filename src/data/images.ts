/**
 * Images of a prompt row, named by slime's `multimodal_keys` (`{"image": "images"}`:
 * media type → record key). slime's `Dataset` (slime/utils/data.py) appends one
 * content part `{type: media_type, path: record[key]}` after the text part; the
 * processor loads them later (slime/utils/processing_utils.py). rlq loads and
 * checks them when the dataset is loaded, so a missing or unreadable image is a
 * row error (with its row and key) instead of a failed rollout.
 *
 * A key's value is one image or a list of them; each image is
 * - a string path, relative to the dataset file's directory (or absolute);
 * - a string `data:image/...;base64,...` URI;
 * - bytes (a Parquet binary column);
 * - a Hugging Face `datasets.Image` struct `{bytes, path}` (bytes when set, else path).
 *
 * Where the bytes stay: a path image stays where the dataset has it (the row
 * records its absolute path and hash; a changed file is refused when read
 * again, see `readPromptImage`); an inline image (data URI, bytes) is written
 * once to a content-addressed directory (`<imageStoreDir>/<sha256>`, by default
 * `RLQ_HOME/images`). Postgres holds only hashes and origins.
 */

import { mkdirSync, readFileSync, renameSync, statSync, writeFileSync } from "node:fs";
import { isAbsolute, join, resolve } from "node:path";
import { sha256Hex } from "../lib/hash.ts";
import { RlqError } from "../lib/errors.ts";

/** slime --multimodal-keys: media type → record key. */
export type MultimodalKeys = Record<string, string>;

export type ImageOrigin = "path" | "data_uri" | "bytes";

export interface PromptImage {
  /** The media type named in multimodal_keys (`image`): the content part's `type`. */
  type: string;
  /** The record key it came from. */
  key: string;
  /** sha256 (hex) of the image file's bytes. */
  sha256: string;
  byteLength: number;
  /** The image format, read from its magic bytes. */
  mime: string;
  origin: ImageOrigin;
  /** Where the bytes are: the dataset's file (origin path) or the content-addressed store (inline). */
  path: string;
  /** The dataset's own reference, for path images (as written in the row); null for inline ones. */
  source: string | null;
}

export interface ImageLoadOptions {
  /** The dataset file's directory: relative image paths are read from here. */
  baseDir: string;
  /** Where inline images are written, named by their sha256. Required when a row holds one. */
  imageStoreDir?: string | null;
}

type Decoded<T> = { ok: true; value: T } | { ok: false; error: string };

/** The image formats an HF image processor (PIL) reads that rlq recognises by their first bytes. */
function sniffMime(b: Uint8Array): string | null {
  const starts = (...sig: number[]) => sig.every((x, i) => b[i] === x);
  if (starts(0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a)) return "image/png";
  if (starts(0xff, 0xd8, 0xff)) return "image/jpeg";
  if (starts(0x47, 0x49, 0x46, 0x38)) return "image/gif";
  if (starts(0x42, 0x4d)) return "image/bmp";
  if (starts(0x52, 0x49, 0x46, 0x46) && b[8] === 0x57 && b[9] === 0x45 && b[10] === 0x42 && b[11] === 0x50) return "image/webp";
  return null;
}

const dataUri = /^data:([^;,]*)(;base64)?,(.*)$/s;

function storeInline(bytes: Uint8Array, sha: string, dir: string): string {
  const path = join(dir, sha);
  try {
    if (statSync(path).size === bytes.byteLength) return path;
  } catch {
    // not stored yet
  }
  mkdirSync(dir, { recursive: true });
  // Written under a temporary name then renamed: a reader never sees half an image.
  const tmp = `${path}.${process.pid}.tmp`;
  writeFileSync(tmp, bytes);
  renameSync(tmp, path);
  return path;
}

function oneImage(value: unknown, type: string, key: string, where: string, o: ImageLoadOptions): Decoded<PromptImage> {
  let bytes: Uint8Array;
  let origin: ImageOrigin;
  let source: string | null = null;
  let filePath: string | null = null;
  if (value !== null && typeof value === "object" && !(value instanceof Uint8Array) && !Array.isArray(value)) {
    // datasets.Image's struct: {bytes: binary | null, path: string | null}.
    const s = value as { bytes?: unknown; path?: unknown };
    if (s.bytes instanceof Uint8Array && s.bytes.byteLength > 0) value = s.bytes;
    else if (typeof s.path === "string" && s.path !== "") value = s.path;
    else return { ok: false, error: `${where}: an image struct needs bytes or a path, got neither` };
  }
  if (value instanceof Uint8Array) {
    bytes = value;
    origin = "bytes";
  } else if (typeof value === "string" && value.startsWith("data:")) {
    const m = dataUri.exec(value);
    if (!m || m[2] !== ";base64") return { ok: false, error: `${where}: a data URI must be base64 (data:image/png;base64,...)` };
    bytes = Buffer.from(m[3] as string, "base64");
    origin = "data_uri";
  } else if (typeof value === "string" && value !== "") {
    if (/^[a-z][a-z0-9+.-]*:\/\//i.test(value))
      return {
        ok: false,
        error: `${where}: ${value} is a URL; rlq reads images from files, data URIs or bytes (download it next to the dataset and write its path)`,
      };
    filePath = isAbsolute(value) ? value : resolve(o.baseDir, value);
    source = value;
    origin = "path";
    try {
      bytes = readFileSync(filePath);
    } catch (e) {
      return {
        ok: false,
        error: `${where}: image ${value} cannot be read (${(e as NodeJS.ErrnoException).code ?? (e as Error).message}; looked at ${filePath})`,
      };
    }
  } else {
    return { ok: false, error: `${where}: expected a path, a data URI, bytes or {bytes, path}, got ${value === null ? "null" : typeof value}` };
  }
  const mime = sniffMime(bytes);
  if (mime === null)
    return { ok: false, error: `${where}: not an image (PNG, JPEG, GIF, BMP or WebP) in ${bytes.byteLength} bytes${source ? ` of ${source}` : ""}` };
  const sha256 = sha256Hex(bytes);
  if (filePath === null) {
    if (!o.imageStoreDir) return { ok: false, error: `${where}: an inline image needs an image store directory (RLQ_HOME/images)` };
    filePath = storeInline(bytes, sha256, o.imageStoreDir);
  }
  return { ok: true, value: { type, key, sha256, byteLength: bytes.byteLength, mime, origin, path: filePath, source } };
}

/**
 * The images of one record (already through `plainJson`), in multimodal_keys
 * order then list order, as slime appends their content parts. A key absent
 * from the record (or null) contributes none, as in slime's `if data_key in data`.
 * Errors name the key and the list position; the loader prefixes the row.
 */
export function loadRecordImages(record: Record<string, unknown>, keys: MultimodalKeys, o: ImageLoadOptions): Decoded<PromptImage[]> {
  const out: PromptImage[] = [];
  for (const [type, key] of Object.entries(keys)) {
    const v = record[key];
    if (v === undefined || v === null) continue;
    const list = Array.isArray(v) ? v : [v];
    for (let i = 0; i < list.length; i++) {
      const where = `multimodal key '${key}'${Array.isArray(v) ? `[${i}]` : ""}`;
      const img = oneImage(list[i], type, key, where, o);
      if (!img.ok) return img;
      out.push(img.value);
    }
  }
  return { ok: true, value: out };
}

/**
 * One image from anywhere the dataset loader takes one (a path, a data URI, bytes, `{bytes, path}`):
 * a tool observation's image in a custom generate function (rollout/custom-generate.ts). `key`
 * names where it came from in the history (`observation`).
 */
export function loadImage(value: unknown, type: string, key: string, where: string, o: ImageLoadOptions): Decoded<PromptImage> {
  return oneImage(value, type, key, where, o);
}

/** An image's bytes for an engine request, refusing a file that changed since the dataset was loaded. */
export function readPromptImage(img: Pick<PromptImage, "path" | "sha256">): Buffer {
  let bytes: Buffer;
  try {
    bytes = readFileSync(img.path);
  } catch (e) {
    throw new RlqError("dataset_changed", `image ${img.path} (sha256 ${img.sha256}) cannot be read: ${(e as Error).message}`, { cause: e });
  }
  const sha = sha256Hex(bytes);
  if (sha !== img.sha256)
    throw new RlqError("dataset_changed", `image ${img.path} changed since the dataset was loaded (sha256 ${sha}, expected ${img.sha256}); restore it`);
  return bytes;
}

/** A `data:` URI of the image, the form both SGLang's image_data and OpenAI image_url accept. */
export function imageDataUri(img: PromptImage): string {
  return `data:${img.mime};base64,${readPromptImage(img).toString("base64")}`;
}
