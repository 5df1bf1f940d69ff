import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";

export function sha256Hex(data: string | Uint8Array): string {
  return createHash("sha256").update(data).digest("hex");
}

/** Read size of sha256File: the stream's default 64 KiB spends more time per chunk than hashing it. */
const HASH_CHUNK_BYTES = 1 << 20;

/**
 * sha256 (hex) of a file's bytes from offset `start` (default 0) to its end, read as a stream:
 * memory stays at one chunk whatever the size. A checkpoint is hashed with this, never read whole:
 * Node refuses to read a file over 2 GiB into one Buffer (ERR_FS_FILE_TOO_LARGE), and a 0.5B
 * model's fp32 weights come near that.
 */
export async function sha256File(path: string, start = 0): Promise<string> {
  const h = createHash("sha256");
  for await (const chunk of createReadStream(path, { start, highWaterMark: HASH_CHUNK_BYTES })) h.update(chunk as Buffer);
  return h.digest("hex");
}

/** A stable 32-bit seed from any list of integers/strings (FNV-1a over their text). */
export function seedFrom(...parts: ReadonlyArray<string | number>): number {
  let h = 0x811c9dc5;
  const text = parts.join("|");
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h >>> 0;
}
