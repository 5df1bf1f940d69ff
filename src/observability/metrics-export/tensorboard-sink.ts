/**
 * Appends metric points to TensorBoard event files in `dir`, exactly once each.
 *
 * What has been written is read back from the files themselves, not kept
 * elsewhere: at open, every `events.out.tfevents.*` file in `dir` is scanned,
 * a torn last record (a crash mid-append) is cut off, and the (stream, step)
 * of every whole event is remembered. A point already there is skipped; one
 * missing is appended and fsynced before the next. So a SIGKILL anywhere
 * neither drops (the point is re-read from Postgres) nor duplicates (it is
 * found in the file) a point. One writer per directory: the sink loop holds
 * an advisory lock per run (metric-sinks.ts).
 */

import { closeSync, fsyncSync, ftruncateSync, mkdirSync, openSync, readdirSync, readFileSync, writeSync } from "node:fs";
import { hostname } from "node:os";
import { join } from "node:path";
import { encodeEvent, decodeEventKeys, frameRecord, scanRecords } from "./tfevents.ts";
import { pointKey, type MetricPoint } from "./points.ts";

export interface TensorboardSink {
  readonly dir: string;
  readonly file: string;
  has(p: { stream: string; step: number }): boolean;
  /** Last train step written (-1: none). */
  lastTrainStep(): number;
  write(p: MetricPoint): void;
  close(): void;
}

const prefix = "events.out.tfevents.";

/** The stream an event belongs to, from its tags (eval events lead with `eval/<dataset>`). */
function streamOf(tags: string[]): string {
  const first = tags[0] ?? "";
  return first.startsWith("eval/") ? first : "train";
}

export function openTensorboardSink(dir: string, options: { crashAfterBytes?: number } = {}): TensorboardSink {
  mkdirSync(dir, { recursive: true });
  const written = new Set<string>();
  let lastTrain = -1;
  const files = readdirSync(dir)
    .filter((f) => f.startsWith(prefix))
    .sort();
  let target: string | null = null;
  for (const f of files) {
    const path = join(dir, f);
    const buf = readFileSync(path);
    const scan = scanRecords(buf);
    if (scan.validBytes < buf.length) {
      // A torn tail: the crash happened mid-append. Cut it so the file is whole again.
      const fd = openSync(path, "r+");
      try {
        ftruncateSync(fd, scan.validBytes);
        fsyncSync(fd);
      } finally {
        closeSync(fd);
      }
    }
    for (const rec of scan.records) {
      const { step, tags, fileVersion } = decodeEventKeys(rec);
      if (fileVersion !== null || tags.length === 0) continue;
      const stream = streamOf(tags);
      written.add(pointKey({ stream, step }));
      if (stream === "train") lastTrain = Math.max(lastTrain, step);
    }
    target = path;
  }
  let fd: number;
  if (target === null) {
    // torch's SummaryWriter names files events.out.tfevents.<time>.<host>.<pid>.<n>; TensorBoard reads any name with this prefix.
    target = join(dir, `${prefix}${String(Math.floor(Date.now() / 1000)).padStart(10, "0")}.${hostname()}.${process.pid}.0`);
    fd = openSync(target, "a");
    writeSync(fd, frameRecord(encodeEvent({ wallTime: Date.now() / 1000, fileVersion: "brain.Event:2" })));
    fsyncSync(fd);
  } else {
    fd = openSync(target, "a");
  }
  let bytesWritten = 0;
  return {
    dir,
    file: target,
    has: (p) => written.has(pointKey(p)),
    lastTrainStep: () => lastTrain,
    write(p) {
      if (p.scalars.length === 0 || written.has(pointKey(p))) return;
      // Eval events must lead with eval/<dataset> so the stream is recoverable from the file.
      const scalars = p.stream === "train" ? p.scalars : [...p.scalars].sort((a, b) => (a.tag === p.stream ? -1 : b.tag === p.stream ? 1 : 0));
      const record = frameRecord(encodeEvent({ wallTime: p.wallTime, step: p.step, scalars }));
      if (options.crashAfterBytes !== undefined && bytesWritten + record.length > options.crashAfterBytes) {
        // Test-only: leave a torn record, as a SIGKILL mid-write would.
        writeSync(fd, record.subarray(0, Math.max(1, options.crashAfterBytes - bytesWritten)));
        fsyncSync(fd);
        throw new Error("tensorboard sink: simulated crash mid-record");
      }
      writeSync(fd, record);
      fsyncSync(fd);
      bytesWritten += record.length;
      written.add(pointKey(p));
      if (p.stream === "train") lastTrain = Math.max(lastTrain, p.step);
    },
    close() {
      closeSync(fd);
    },
  };
}
