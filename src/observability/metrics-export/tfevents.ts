/**
 * TensorBoard event files, written without TensorFlow: TFRecord framing around
 * `tensorflow.Event` protobufs with scalar summaries.
 *
 * Framing (tensorflow/core/lib/io/record_writer.cc, read back by
 * tensorboard/backend/event_processing/event_file_loader.py):
 *   uint64 length (LE) · uint32 masked_crc32c(length bytes) · data · uint32 masked_crc32c(data)
 * masked_crc = ((crc >>> 15) | (crc << 17)) + 0xa282ead8 (tensorflow/core/lib/hash/crc32c.h, Mask).
 *
 * Protobuf (tensorflow/core/util/event.proto, tensorflow/core/framework/summary.proto):
 *   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
 *   Summary { repeated Value value = 1; }
 *   Value   { string tag = 1; float simple_value = 2; }
 * torch's SummaryWriter.add_scalar (what slime's tensorboard_utils.py calls) writes the same
 * simple_value form, one Value per event; we put all the scalars of one step in one event, which
 * the Summary message allows and readers expand per value. One event per step is also what makes
 * the sink crash-safe: an event is whole or (torn) absent.
 */

const crcTable = (() => {
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    // Castagnoli polynomial, reflected.
    for (let k = 0; k < 8; k++) c = c & 1 ? 0x82f63b78 ^ (c >>> 1) : c >>> 1;
    t[n] = c >>> 0;
  }
  return t;
})();

export function crc32c(buf: Uint8Array): number {
  let c = 0xffffffff;
  for (let i = 0; i < buf.length; i++) c = (crcTable[(c ^ (buf[i] as number)) & 0xff] as number) ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

export function maskedCrc32c(buf: Uint8Array): number {
  const c = crc32c(buf);
  return ((((c >>> 15) | (c << 17)) >>> 0) + 0xa282ead8) >>> 0;
}

/** Frame one record: the bytes appended to an event file. */
export function frameRecord(data: Uint8Array): Buffer {
  const header = Buffer.alloc(12);
  header.writeBigUInt64LE(BigInt(data.length), 0);
  header.writeUInt32LE(maskedCrc32c(header.subarray(0, 8)), 8);
  const footer = Buffer.alloc(4);
  footer.writeUInt32LE(maskedCrc32c(data), 0);
  return Buffer.concat([header, data, footer]);
}

function varint(n: bigint): number[] {
  const out: number[] = [];
  let v = BigInt.asUintN(64, n);
  while (v >= 0x80n) {
    out.push(Number(v & 0x7fn) | 0x80);
    v >>= 7n;
  }
  out.push(Number(v));
  return out;
}

function lengthDelimited(field: number, bytes: Uint8Array): Buffer {
  return Buffer.concat([Buffer.from([(field << 3) | 2, ...varint(BigInt(bytes.length))]), bytes]);
}

export interface ScalarEvent {
  /** Seconds since the epoch (fractional). */
  wallTime: number;
  step: number;
  scalars: ReadonlyArray<{ tag: string; value: number }>;
}

/** Encode a `tensorflow.Event` with a scalar summary (or, with `fileVersion`, the file's first event). */
export function encodeEvent(e: { wallTime: number; step?: number; fileVersion?: string; scalars?: ScalarEvent["scalars"] }): Buffer {
  const parts: Buffer[] = [];
  const wall = Buffer.alloc(9);
  wall[0] = (1 << 3) | 1; // field 1, fixed64
  wall.writeDoubleLE(e.wallTime, 1);
  parts.push(wall);
  if (e.step !== undefined && e.step !== 0) parts.push(Buffer.from([(2 << 3) | 0, ...varint(BigInt(e.step))]));
  if (e.fileVersion !== undefined) parts.push(lengthDelimited(3, Buffer.from(e.fileVersion, "utf8")));
  if (e.scalars && e.scalars.length > 0) {
    const values = e.scalars.map(({ tag, value }) => {
      const v = Buffer.alloc(5);
      v[0] = (2 << 3) | 5; // field 2, fixed32
      v.writeFloatLE(value, 1);
      return lengthDelimited(1, Buffer.concat([lengthDelimited(1, Buffer.from(tag, "utf8")), v]));
    });
    parts.push(lengthDelimited(5, Buffer.concat(values)));
  }
  return Buffer.concat(parts);
}

export interface ScannedFile {
  /** Event payloads of the whole, CRC-valid records, in order. */
  records: Buffer[];
  /** Bytes of whole records; anything after is a torn tail (a crash mid-append) to cut off. */
  validBytes: number;
}

/** Read the records of an event file, stopping at the first torn or corrupt one. */
export function scanRecords(buf: Buffer): ScannedFile {
  const records: Buffer[] = [];
  let off = 0;
  while (off + 12 <= buf.length) {
    const lenBytes = buf.subarray(off, off + 8);
    if (buf.readUInt32LE(off + 8) !== maskedCrc32c(lenBytes)) break;
    const len = Number(buf.readBigUInt64LE(off));
    const end = off + 12 + len + 4;
    if (end > buf.length) break;
    const data = buf.subarray(off + 12, off + 12 + len);
    if (buf.readUInt32LE(off + 12 + len) !== maskedCrc32c(data)) break;
    records.push(Buffer.from(data));
    off = end;
  }
  return { records, validBytes: off };
}

/** Decode what this module writes: step and tags of an event (enough to know what a file holds). */
export function decodeEventKeys(data: Buffer): { step: number; tags: string[]; fileVersion: string | null } {
  let off = 0;
  let step = 0;
  let fileVersion: string | null = null;
  const tags: string[] = [];
  const readVarint = (b: Buffer, at: number): [bigint, number] => {
    let v = 0n;
    let shift = 0n;
    for (;;) {
      const byte = b[at++] as number;
      v |= BigInt(byte & 0x7f) << shift;
      if ((byte & 0x80) === 0) return [v, at];
      shift += 7n;
    }
  };
  const skip = (b: Buffer, at: number, wire: number): number => {
    if (wire === 0) return readVarint(b, at)[1];
    if (wire === 1) return at + 8;
    if (wire === 5) return at + 4;
    const [len, next] = readVarint(b, at);
    return next + Number(len);
  };
  while (off < data.length) {
    const [key, next] = readVarint(data, off);
    off = next;
    const field = Number(key >> 3n);
    const wire = Number(key & 7n);
    if (field === 2 && wire === 0) {
      const [v, n2] = readVarint(data, off);
      step = Number(BigInt.asIntN(64, v));
      off = n2;
    } else if ((field === 3 || field === 5) && wire === 2) {
      const [len, n2] = readVarint(data, off);
      const body = data.subarray(n2, n2 + Number(len));
      off = n2 + Number(len);
      if (field === 3) fileVersion = body.toString("utf8");
      else {
        let p = 0;
        while (p < body.length) {
          const [k, q] = readVarint(body, p);
          if (Number(k >> 3n) === 1 && Number(k & 7n) === 2) {
            const [vlen, q2] = readVarint(body, q);
            const value = body.subarray(q2, q2 + Number(vlen));
            p = q2 + Number(vlen);
            let r = 0;
            while (r < value.length) {
              const [vk, r2] = readVarint(value, r);
              if (Number(vk >> 3n) === 1 && Number(vk & 7n) === 2) {
                const [tlen, r3] = readVarint(value, r2);
                tags.push(value.subarray(r3, r3 + Number(tlen)).toString("utf8"));
                r = r3 + Number(tlen);
              } else r = skip(value, r2, Number(vk & 7n));
            }
          } else p = skip(body, q, Number(k & 7n));
        }
      }
    } else off = skip(data, off, wire);
  }
  return { step, tags, fileVersion };
}
