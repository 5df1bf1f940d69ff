import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { sha256File, sha256Hex } from "./hash.ts";

describe("sha256File", () => {
  const dir = mkdtempSync(join(tmpdir(), "rlq-hash-unit-"));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it("equals the in-memory hash of the file's bytes, whole and from an offset, over many stream chunks", async () => {
    // 300 KiB: several of the read stream's 64 KiB chunks, the offset inside the first.
    const bytes = Buffer.alloc(300 * 1024);
    for (let i = 0; i < bytes.length; i++) bytes[i] = (i * 31) & 0xff;
    const path = join(dir, "w");
    writeFileSync(path, bytes);
    expect(await sha256File(path)).toBe(sha256Hex(bytes));
    expect(await sha256File(path, 1000)).toBe(sha256Hex(bytes.subarray(1000)));
    expect(await sha256File(path, bytes.length)).toBe(sha256Hex(Buffer.alloc(0)));
  });

  it("rejects a missing file with its ENOENT", async () => {
    await expect(sha256File(join(dir, "absent"))).rejects.toMatchObject({ code: "ENOENT" });
  });
});
