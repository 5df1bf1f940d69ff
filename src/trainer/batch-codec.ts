/**
 * The trainer protocol's binary batch format, "RLQB" version 1
 * (docs/trainer-protocol.md). Little-endian throughout:
 *   bytes 0..3  magic "RLQB"; 4..7 u32 version = 1; 8..11 u32 header length H
 *   12..12+H    UTF-8 JSON header: {run_id, step, num_samples, arrays: [{name, dtype, length}]}
 *   then each array in header order, each starting at an 8-byte aligned offset.
 * Arrays (N samples, T total tokens, R total response tokens):
 *   token_offsets int32[N+1], prompt_lengths int32[N], tokens int32[T],
 *   response_offsets int32[N+1], loss_mask uint8[R], denom_mask uint8[R] (optional on decode),
 *   rollout_log_probs float32[R],
 *   token_versions int32[R], rewards float64[N], group_index int32[N], sample_index int32[N]
 * With images (multimodal_keys), each distinct image once: the header's `images` [{sha256, mime}]
 * (M), image_bytes uint8[sum of sizes], image_offsets int32[M+1], sample_image_offsets int32[N+1],
 * sample_images int32[K] (indices into `images`). The bytes travel in the batch, never in Postgres;
 * the trainer checks each against its sha256.
 */

import type { TrainBatch, TrainImage, TrainSample } from "./trainer.ts";
import { RlqError } from "../lib/errors.ts";
import { sha256Hex } from "../lib/hash.ts";
import { readPromptImage } from "../data/images.ts";

const MAGIC = 0x42514c52; // "RLQB" read as u32 LE

type Dtype = "int32" | "uint8" | "float32" | "float64";
const ctor = { int32: Int32Array, uint8: Uint8Array, float32: Float32Array, float64: Float64Array } as const;

export function encodeBatch(batch: TrainBatch): Uint8Array {
  const s = batch.samples;
  const n = s.length;
  const tokenOffsets = new Int32Array(n + 1);
  const responseOffsets = new Int32Array(n + 1);
  for (let i = 0; i < n; i++) {
    tokenOffsets[i + 1] = (tokenOffsets[i] as number) + (s[i] as TrainSample).tokens.length;
    responseOffsets[i + 1] = (responseOffsets[i] as number) + (s[i] as TrainSample).responseLength;
  }
  const cat = <T extends Int32Array | Uint8Array | Float32Array>(C: new (n: number) => T, total: number, pick: (x: TrainSample) => ArrayLike<number>) => {
    const out = new C(total);
    let o = 0;
    for (const x of s) {
      const a = pick(x);
      (out as unknown as { set(a: ArrayLike<number>, o: number): void }).set(a, o);
      o += a.length;
    }
    return out;
  };
  const arrays: ArrayEntry[] = [
    ["token_offsets", "int32", tokenOffsets],
    ["prompt_lengths", "int32", Int32Array.from(s, (x) => x.promptLength)],
    ["tokens", "int32", cat(Int32Array, tokenOffsets[n] as number, (x) => x.tokens)],
    ["response_offsets", "int32", responseOffsets],
    ["loss_mask", "uint8", cat(Uint8Array, responseOffsets[n] as number, (x) => x.lossMask)],
    ["denom_mask", "uint8", cat(Uint8Array, responseOffsets[n] as number, (x) => x.denomMask ?? x.lossMask)],
    ["rollout_log_probs", "float32", cat(Float32Array, responseOffsets[n] as number, (x) => x.rolloutLogProbs)],
    ["token_versions", "int32", cat(Int32Array, responseOffsets[n] as number, (x) => x.tokenVersions)],
    ["rewards", "float64", Float64Array.from(s, (x) => x.reward)],
    ["group_index", "int32", Int32Array.from(s, (x) => x.groupIndex)],
    ["sample_index", "int32", Int32Array.from(s, (x) => x.sampleIndex)],
  ];
  // use_opd: every sample carries its teacher's log-probs (jobs/teacher-logprobs.ts waits for them), or none does.
  if (s.some((x) => x.teacherLogProbs !== undefined)) {
    arrays.push([
      "teacher_log_probs",
      "float32",
      cat(Float32Array, responseOffsets[n] as number, (x) => {
        if (x.teacherLogProbs === undefined)
          throw new RlqError("trainer_bad_batch", `batch: sample ${x.sampleIndex} of group ${x.groupIndex} has no teacher log-probs`);
        return x.teacherLogProbs;
      }),
    ]);
  }
  const images = s.some((x) => x.images !== undefined && x.images.length > 0) ? imageArrays(s) : null;
  if (images !== null) arrays.push(...images.arrays);
  const header = new TextEncoder().encode(
    JSON.stringify({
      run_id: batch.runId,
      step: batch.step,
      num_samples: n,
      ...(images !== null && { images: images.refs }),
      arrays: arrays.map(([name, dtype, a]) => ({ name, dtype, length: a.length })),
    }),
  );
  const align = (x: number) => (x + 7) & ~7;
  let size = align(12 + header.length);
  for (const [, , a] of arrays) size = align(size + a.byteLength);
  const out = new Uint8Array(size);
  const view = new DataView(out.buffer);
  view.setUint32(0, MAGIC, true);
  view.setUint32(4, 1, true);
  view.setUint32(8, header.length, true);
  out.set(header, 12);
  let off = align(12 + header.length);
  for (const [, , a] of arrays) {
    out.set(new Uint8Array(a.buffer, a.byteOffset, a.byteLength), off);
    off = align(off + a.byteLength);
  }
  return out;
}

type ArrayEntry = [string, Dtype, ArrayLike<number> & { buffer: ArrayBufferLike; byteOffset: number; byteLength: number }];

/** The image arrays: each distinct image (by sha256) once, read from where the rollout read it and checked. */
function imageArrays(s: readonly TrainSample[]): { refs: Array<{ sha256: string; mime: string }>; arrays: ArrayEntry[] } {
  const index = new Map<string, number>();
  const refs: Array<{ sha256: string; mime: string }> = [];
  const blobs: Uint8Array[] = [];
  const uses: number[] = [];
  const sampleOffsets = new Int32Array(s.length + 1);
  for (const [i, x] of s.entries()) {
    for (const img of x.images ?? []) {
      let k = index.get(img.sha256);
      if (k === undefined) {
        k = refs.length;
        index.set(img.sha256, k);
        refs.push({ sha256: img.sha256, mime: img.mime });
        blobs.push(imageBytes(img, x));
      }
      uses.push(k);
    }
    sampleOffsets[i + 1] = uses.length;
  }
  const imageOffsets = new Int32Array(blobs.length + 1);
  for (const [m, b] of blobs.entries()) imageOffsets[m + 1] = (imageOffsets[m] as number) + b.byteLength;
  const all = new Uint8Array(imageOffsets[blobs.length] as number);
  for (const [m, b] of blobs.entries()) all.set(b, imageOffsets[m]);
  return {
    refs,
    arrays: [
      ["image_bytes", "uint8", all],
      ["image_offsets", "int32", imageOffsets],
      ["sample_image_offsets", "int32", sampleOffsets],
      ["sample_images", "int32", Int32Array.from(uses)],
    ],
  };
}

function imageBytes(img: TrainImage, x: TrainSample): Uint8Array {
  if (img.bytes !== undefined) {
    if (sha256Hex(img.bytes) !== img.sha256)
      throw new RlqError("trainer_bad_batch", `batch: sample ${x.sampleIndex} of group ${x.groupIndex}: image bytes do not hash to ${img.sha256}`);
    return img.bytes;
  }
  if (img.path === undefined)
    throw new RlqError("trainer_bad_batch", `batch: sample ${x.sampleIndex} of group ${x.groupIndex}: image ${img.sha256} has neither path nor bytes`);
  return readPromptImage({ path: img.path, sha256: img.sha256 });
}

/** Each sample's images from a decoded batch's image arrays (bytes in hand, path absent). */
function decodedImages(refs: Array<{ sha256: string; mime: string }>, t: Record<string, ArrayLike<number>>, n: number): Array<TrainImage[] | undefined> {
  const raw = t["image_bytes"] as Uint8Array;
  const io = t["image_offsets"] as Int32Array;
  const so = t["sample_image_offsets"] as Int32Array;
  const si = t["sample_images"] as Int32Array;
  const distinct = refs.map((r, m) => ({ sha256: r.sha256, mime: r.mime, bytes: raw.slice(io[m], io[m + 1]) }));
  return Array.from({ length: n }, (_, i) => {
    const list = Array.from(si.subarray(so[i], so[i + 1]), (k) => distinct[k] as TrainImage);
    return list.length > 0 ? list : undefined;
  });
}

export function decodeBatch(bytes: Uint8Array): TrainBatch {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (bytes.byteLength < 12 || view.getUint32(0, true) !== MAGIC) throw new RlqError("trainer_bad_batch", "batch: bad magic (expected RLQB)");
  const version = view.getUint32(4, true);
  if (version !== 1) throw new RlqError("trainer_bad_batch", `batch: unsupported version ${version}`);
  const hlen = view.getUint32(8, true);
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(12, 12 + hlen))) as {
    run_id: string;
    step: number;
    num_samples: number;
    arrays: Array<{ name: string; dtype: Dtype; length: number }>;
    images?: Array<{ sha256: string; mime: string }>;
  };
  const align = (x: number) => (x + 7) & ~7;
  let off = align(12 + hlen);
  const got: Record<string, Int32Array | Uint8Array | Float32Array | Float64Array> = {};
  for (const a of header.arrays) {
    const C = ctor[a.dtype];
    // Uint8Array's slice copies; a Node Buffer's slice is a view into its (often shared) pool, whose offset 0 is not this array's.
    const copy = Uint8Array.prototype.slice.call(bytes, off, off + a.length * C.BYTES_PER_ELEMENT);
    got[a.name] = new C(copy.buffer, 0, a.length);
    off = align(off + a.length * C.BYTES_PER_ELEMENT);
  }
  const t = got;
  const tokenOffsets = t["token_offsets"] as Int32Array;
  const respOffsets = t["response_offsets"] as Int32Array;
  const images = header.images && t["image_bytes"] ? decodedImages(header.images, t, header.num_samples) : null;
  const samples: TrainSample[] = [];
  for (let i = 0; i < header.num_samples; i++) {
    const sampleImages = images?.[i];
    const r0 = respOffsets[i] as number;
    const r1 = respOffsets[i + 1] as number;
    samples.push({
      tokens: (t["tokens"] as Int32Array).slice(tokenOffsets[i], tokenOffsets[i + 1]),
      promptLength: (t["prompt_lengths"] as Int32Array)[i] as number,
      responseLength: r1 - r0,
      lossMask: (t["loss_mask"] as Uint8Array).slice(r0, r1),
      denomMask: ((t["denom_mask"] ?? t["loss_mask"]) as Uint8Array).slice(r0, r1),
      rolloutLogProbs: (t["rollout_log_probs"] as Float32Array).slice(r0, r1),
      tokenVersions: (t["token_versions"] as Int32Array).slice(r0, r1),
      ...(t["teacher_log_probs"] && { teacherLogProbs: (t["teacher_log_probs"] as Float32Array).slice(r0, r1) }),
      reward: (t["rewards"] as Float64Array)[i] as number,
      groupIndex: (t["group_index"] as Int32Array)[i] as number,
      sampleIndex: (t["sample_index"] as Int32Array)[i] as number,
      ...(sampleImages !== undefined && { images: sampleImages }),
    });
  }
  return { runId: header.run_id, step: header.step, samples };
}
