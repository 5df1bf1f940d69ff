import { describe, expect, it } from "vitest";
import { RlqError } from "../lib/errors.ts";
import { EngineHttpError } from "./http.ts";
import { responseLogProbs, teacherLogProbsWaiting, type TeacherEngine } from "./teacher.ts";

const req = { tokens: [1, 2, 3, 4, 5], promptLength: 3 };

describe("responseLogProbs", () => {
  it("keeps the response positions and checks the token ids", () => {
    const pos = [null, -1, -2, -0.5, -0.25].map((logProb, i) => (logProb === null ? null : { tokenId: i + 1, logProb }));
    expect(Array.from(responseLogProbs("u", req, pos))).toEqual([-0.5, -0.25]);
    const swapped = pos.map((p, i) => (i === 4 && p ? { ...p, tokenId: 9 } : p));
    expect(() => responseLogProbs("u", req, swapped)).toThrow(/position 4 is token 9, expected 5/);
    expect(() => responseLogProbs("u", req, pos.slice(1))).toThrow(/4 positions for 5 tokens/);
    const hole = pos.map((p, i) => (i === 3 ? null : p));
    expect(() => responseLogProbs("u", req, hole)).toThrow(/no log-prob at position 3/);
  });
});

describe("teacherLogProbsWaiting", () => {
  const down = () => new EngineHttpError("engine_unreachable", "teacher: ECONNREFUSED", { isRetriable: true });
  function flaky(failures: number, error = down): TeacherEngine & { calls: number } {
    const t = {
      url: "http://teacher",
      calls: 0,
      logProbs: async () => {
        t.calls++;
        if (t.calls <= failures) throw error();
        return Float32Array.of(-1);
      },
    };
    return t;
  }
  const clock = () => {
    let now = 0;
    return { now: () => now, sleep: async (ms: number) => void (now += ms) };
  };

  it("waits out a teacher that is down, with capped backoff, and returns its answer", async () => {
    const t = flaky(5);
    const c = clock();
    const retries: number[] = [];
    const out = await teacherLogProbsWaiting(t, req, { waitMs: 60_000, maxBackoffMs: 300, ...c, onRetry: (_, a) => retries.push(a) });
    expect(Array.from(out)).toEqual([-1]);
    expect(retries).toEqual([0, 1, 2, 3, 4]);
    expect(c.now()).toBe(100 + 200 + 300 + 300 + 300);
  });

  it("past waitMs the failure is thrown retriable (the job's queue retries; the sample keeps waiting)", async () => {
    const c = clock();
    const e = await teacherLogProbsWaiting(flaky(1000), req, { waitMs: 1000, maxBackoffMs: 300, ...c }).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(RlqError);
    expect(e).toMatchObject({ code: "engine_request_failed", isRetriable: true });
  });

  it("a refusal that retrying cannot fix is thrown at once", async () => {
    const bad = () => new EngineHttpError("engine_http_error", "teacher: HTTP 400: token id out of vocabulary", { isRetriable: false, status: 400 });
    const t = flaky(1, bad);
    await expect(teacherLogProbsWaiting(t, req, { waitMs: 60_000, ...clock() })).rejects.toMatchObject({ code: "engine_http_error", isRetriable: false });
    expect(t.calls).toBe(1);
  });
});
