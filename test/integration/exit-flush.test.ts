import { spawn } from "node:child_process";
import { describe, expect, it } from "vitest";
import { repoRoot } from "../helpers/processes.ts";

/**
 * The CLI's exit waits for its output to reach the pipe (src/cli/exit.ts). The reader here reads
 * nothing until the child says it has written everything, so most of the 2 MiB is still queued
 * inside the child when it exits: a bare process.exit would drop it (`rlq export` lost 20 of 96
 * samples that way on a loaded machine).
 */
describe("exit after the output is flushed", () => {
  it("a slow reader still gets all of stdout", async () => {
    {
      const child = spawn(process.execPath, ["--import", "tsx", "test/fixtures/write-then-exit.ts"], {
        cwd: repoRoot,
        stdio: ["ignore", "pipe", "pipe"],
      });
      child.stdout.pause();
      let stderr = "";
      await new Promise<void>((resolve) =>
        child.stderr.on("data", (d: Buffer) => {
          stderr += d.toString();
          if (stderr.includes("written\n")) resolve();
        }),
      );
      let bytes = 0;
      child.stdout.on("data", (d: Buffer) => (bytes += d.length));
      child.stdout.resume(); // an explicit pause() is not undone by a 'data' listener
      const code = await new Promise<number | null>((resolve) => child.on("close", (c) => resolve(c)));
      expect(code).toBe(0);
      expect(bytes).toBe(2048 * 1024);
    }
  });
});
