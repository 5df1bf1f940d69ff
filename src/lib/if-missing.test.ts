import { mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { ifMissing } from "./if-missing.ts";

describe("ifMissing", () => {
  it("answers the fallback for a path that does not exist, and passes any other error on", async () => {
    const dir = await mkdtemp(join(tmpdir(), "rlq-if-missing-"));
    try {
      expect(await readdir(join(dir, "absent")).catch(ifMissing([] as string[]))).toEqual([]);
      expect(await readFile(join(dir, "absent.json"), "utf8").catch(ifMissing(null))).toBeNull();
      // A directory read as a file: EISDIR, not a missing file.
      await expect(readFile(dir, "utf8").catch(ifMissing(null))).rejects.toMatchObject({ code: "EISDIR" });
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
