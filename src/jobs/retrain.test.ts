import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { sha256File, sha256Hex } from "../lib/hash.ts";
import { formatRetrain, reproducesCommit, safetensorsDataSha256, type RetrainResult } from "./retrain.ts";

function safetensors(header: object, data: number[]): Buffer {
  const h = Buffer.from(JSON.stringify(header));
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(h.length));
  return Buffer.concat([len, h, Buffer.from(data)]);
}

describe("retrain: comparing with the committed checkpoint", () => {
  const dir = mkdtempSync(join(tmpdir(), "rlq-retrain-unit-"));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  const file = (name: string, bytes: Buffer): string => {
    const path = join(dir, name);
    writeFileSync(path, bytes);
    return path;
  };

  it("hashes a safetensors file's tensor bytes without its header, and refuses what is not one", async () => {
    const a = file("a", safetensors({ __metadata__: { run: "r1" } }, [1, 2, 3]));
    const b = file("b", safetensors({ __metadata__: { run: "r1-retrain-x" } }, [1, 2, 3]));
    expect(await safetensorsDataSha256(a)).toBe(sha256Hex(Buffer.from([1, 2, 3])));
    expect(await safetensorsDataSha256(a)).toBe(await safetensorsDataSha256(b));
    expect(await sha256File(a)).not.toBe(await sha256File(b));
    expect(await safetensorsDataSha256(file("short", Buffer.from([1, 2, 3])))).toBeNull();
    expect(await safetensorsDataSha256(file("f64", Buffer.from(new Float64Array([1, 2, 3]).buffer)))).toBeNull();
    // A header length that fits in the file, over bytes that are not JSON.
    const notJson = Buffer.concat([Buffer.from([3, 0, 0, 0, 0, 0, 0, 0]), Buffer.from("{x}"), Buffer.from([1])]);
    expect(await safetensorsDataSha256(file("notjson", notJson))).toBeNull();
  });

  it("a step reproduces its commit with the same file or the same tensors; the report says which", () => {
    const base: RetrainResult = {
      step: 3,
      checkpointUriIn: "file:///c/step-2",
      outputDir: "/o",
      sha256: "aa",
      committedSha256: "aa",
      sameTensors: true,
      metrics: { pg_loss: 0.5 },
      committedMetrics: { pg_loss: 0.5, kl: 0 },
    };
    expect(reproducesCommit(base)).toBe(true);
    expect(reproducesCommit({ ...base, sha256: "bb", sameTensors: true })).toBe(true);
    expect(reproducesCommit({ ...base, sha256: "bb", sameTensors: false })).toBe(false);
    expect(reproducesCommit({ ...base, sha256: "bb", sameTensors: null })).toBe(false);
    expect(formatRetrain("r1", base, true)).toBe(
      "retrain r1 step 3 from file:///c/step-2\n  weights sha256 aa == committed aa\n  kl: committed 0  retrained -\n  pg_loss: committed 0.5  retrained 0.5\n",
    );
    expect(formatRetrain("r1", { ...base, sha256: "bb", sameTensors: false }, true)).toContain(
      "!= committed aa  MISMATCH (deterministic mode)\n  tensors differ",
    );
    expect(formatRetrain("r1", { ...base, sha256: "bb", sameTensors: true }, true)).toContain("(same tensors; the header differs)");
  });
});
