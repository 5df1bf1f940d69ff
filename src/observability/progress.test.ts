import { describe, expect, it } from "vitest";
import { createProgressDisplay, describe as describeItem, formatDuration } from "./progress.ts";

function sink() {
  const chunks: string[] = [];
  return { chunks, stream: { write: (s: string) => chunks.push(s) } };
}

describe("progress display", () => {
  it("estimates the ETA from the rate since the item was first seen", () => {
    // 2 steps in 10 s since first seen at step 1 -> 0.2 steps/s; 7 left -> 35 s.
    expect(describeItem({ label: "step", done: 3, total: 10, firstAtMs: 0, firstDone: 1 }, 10_000)).toBe("step 3/10 (30%) 0.20/s eta 35s");
    expect(describeItem({ label: "step", done: 1, total: 10, firstAtMs: 0, firstDone: 1 }, 10_000)).toBe("step 1/10 (10%) eta ?");
    expect(describeItem({ label: "step", done: 10, total: 10, firstAtMs: 0, firstDone: 0 }, 5_000)).toBe("step 10/10 (100%) 2.00/s done");
    expect(formatDuration(3725)).toBe("1h02m");
    expect(formatDuration(125)).toBe("2m05s");
  });

  it("redraws one line in place on a TTY", () => {
    let now = 0;
    const s = sink();
    const p = createProgressDisplay({ stream: s.stream, isTty: true, now: () => now });
    p.set("a", { label: "run a", done: 0, total: 4 });
    now = 4000;
    p.set("a", { label: "run a", done: 2, total: 4 });
    p.close();
    expect(s.chunks).toEqual(["\r\x1b[Krun a 0/4 (0%) eta ?", "\r\x1b[Krun a 2/4 (50%) 0.50/s eta 4s", "\r\x1b[K"]);
  });

  it("writes a plain line per change when not on a TTY", () => {
    let now = 0;
    const s = sink();
    const p = createProgressDisplay({ stream: s.stream, isTty: false, now: () => now });
    p.set("a", { label: "step", done: 0, total: 2 });
    now = 1000;
    p.set("a", { label: "step", done: 0, total: 2 });
    now = 2000;
    p.set("a", { label: "step", done: 1, total: 2 });
    p.clear();
    expect(s.chunks).toEqual(["progress: step 0/2 (0%) eta ?\n", "progress: step 1/2 (50%) 0.50/s eta 2s\n"]);
    expect(s.chunks.join("")).not.toContain("\r");
  });
});
