import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import protobuf from "protobufjs";
import { crc32c as refCrc32c } from "@node-rs/crc32";
import { crc32c, encodeEvent, frameRecord } from "./tfevents.ts";
import { openTensorboardSink } from "./tensorboard-sink.ts";

// An independent reader: protobufjs with the messages of tensorflow/core/util/event.proto and
// tensorflow/core/framework/summary.proto (field numbers as published there), and TFRecord framing
// checked with @node-rs/crc32's CRC-32C (tensorflow/core/lib/io/record_reader.cc reads the same).
const root = protobuf.parse(`
syntax = "proto3";
package tensorflow;
message SummaryValue { string tag = 1; float simple_value = 2; }
message Summary { repeated SummaryValue value = 1; }
message Event { double wall_time = 1; int64 step = 2; oneof what { string file_version = 3; Summary summary = 5; } }
`).root;
const Event = root.lookupType("tensorflow.Event");

const mask = (crc: number) => ((((crc >>> 15) | (crc << 17)) >>> 0) + 0xa282ead8) >>> 0;

function readWithReference(buf: Buffer): Array<Record<string, unknown>> {
  const out: Array<Record<string, unknown>> = [];
  let off = 0;
  while (off < buf.length) {
    const len = Number(buf.readBigUInt64LE(off));
    expect(buf.readUInt32LE(off + 8)).toBe(mask(refCrc32c(buf.subarray(off, off + 8))));
    const data = buf.subarray(off + 12, off + 12 + len);
    expect(buf.readUInt32LE(off + 12 + len)).toBe(mask(refCrc32c(data)));
    out.push(Event.toObject(Event.decode(data), { longs: Number, defaults: false }));
    off += 12 + len + 4;
  }
  expect(off).toBe(buf.length);
  return out;
}

const dirs: string[] = [];
const tmp = () => {
  const d = mkdtempSync(join(tmpdir(), "rlq-tb-"));
  dirs.push(d);
  return d;
};
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

describe("TensorBoard event files", () => {
  it("computes CRC-32C as the reference library does (and the RFC 3720 check value)", () => {
    expect(crc32c(Buffer.from("123456789"))).toBe(0xe3069283);
    for (const n of [0, 1, 7, 8, 31, 1000]) {
      const b = Buffer.from(Array.from({ length: n }, (_, i) => (i * 131 + n) & 0xff));
      expect(crc32c(b)).toBe(refCrc32c(b));
    }
  });

  it("writes records a protobuf reader decodes to the same scalars, steps and tags", () => {
    const dir = tmp();
    const sink = openTensorboardSink(dir);
    sink.write({
      stream: "train",
      step: 0,
      wallTime: 1700000000.25,
      scalars: [
        { tag: "train/pg_loss", value: -0.125 },
        { tag: "rollout/raw_reward", value: 0.5 },
      ],
    });
    sink.write({ stream: "train", step: 1, wallTime: 1700000001.5, scalars: [{ tag: "train/pg_loss", value: 0.3 }] });
    sink.write({
      stream: "eval/math",
      step: 1,
      wallTime: 1700000002,
      scalars: [
        { tag: "eval/math/pass@1", value: 0.25 },
        { tag: "eval/math", value: 0.4 },
      ],
    });
    sink.close();
    const [file] = readdirSync(dir);
    expect(file).toMatch(/^events\.out\.tfevents\.\d{10}\./);
    const events = readWithReference(readFileSync(join(dir, file as string)));
    expect(events[0]).toMatchObject({ fileVersion: "brain.Event:2" });
    expect(events.slice(1)).toEqual([
      {
        wallTime: 1700000000.25,
        summary: {
          value: [
            { tag: "train/pg_loss", simpleValue: -0.125 },
            { tag: "rollout/raw_reward", simpleValue: 0.5 },
          ],
        },
      },
      { wallTime: 1700000001.5, step: 1, summary: { value: [{ tag: "train/pg_loss", simpleValue: Math.fround(0.3) }] } },
      // The eval event leads with eval/<dataset>, so its stream can be read back from the file.
      {
        wallTime: 1700000002,
        step: 1,
        summary: {
          value: [
            { tag: "eval/math", simpleValue: Math.fround(0.4) },
            { tag: "eval/math/pass@1", simpleValue: 0.25 },
          ],
        },
      },
    ]);
  });

  it("encodes large steps as int64 varints", () => {
    const data = encodeEvent({ wallTime: 1, step: 2 ** 40 + 3, scalars: [{ tag: "x", value: 1 }] });
    expect(Event.toObject(Event.decode(data), { longs: Number }).step).toBe(2 ** 40 + 3);
    expect(frameRecord(data).length).toBe(data.length + 16);
  });

  it("after a crash mid-record, cuts the torn tail and writes each point exactly once", () => {
    const dir = tmp();
    const points = Array.from({ length: 6 }, (_, step) => ({
      stream: "train",
      step,
      wallTime: 1700000000 + step,
      scalars: [{ tag: "train/kl_loss", value: step / 10 }],
    }));
    const first = openTensorboardSink(dir, { crashAfterBytes: 150 });
    let written = 0;
    expect(() => {
      for (const p of points) {
        first.write(p);
        written++;
      }
    }).toThrow(/simulated crash/);
    first.close();
    expect(written).toBeGreaterThan(0);
    expect(written).toBeLessThan(points.length);
    const file = join(dir, readdirSync(dir)[0] as string);
    const tornSize = statSync(file).size;

    const second = openTensorboardSink(dir);
    expect(statSync(file).size).toBeLessThan(tornSize);
    expect(second.lastTrainStep()).toBe(written - 1);
    // The sink is offered everything again (as the sink loop does after a restart).
    for (const p of points) if (!second.has(p)) second.write(p);
    second.close();
    const steps = readWithReference(readFileSync(file))
      .slice(1)
      .map((e) => (e.step as number | undefined) ?? 0);
    expect(steps).toEqual([0, 1, 2, 3, 4, 5]);
  });
});
