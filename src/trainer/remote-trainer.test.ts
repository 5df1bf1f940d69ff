import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { createRemoteTrainer, isTrainerOutage } from "./remote-trainer.ts";
import type { TrainRequest } from "./trainer.ts";

/**
 * The trainer client against real HTTP servers on 127.0.0.1 (the trainer is
 * another process in production): what counts as an outage (waited for,
 * using no attempt) and what does not.
 */
const servers: Server[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => new Promise((r) => s.close(r))));
});

async function listen(handler: Parameters<typeof createServer>[1], port = 0): Promise<number> {
  const s = createServer(handler);
  servers.push(s);
  await new Promise<void>((r) => s.listen(port, "127.0.0.1", r));
  return (s.address() as AddressInfo).port;
}

/** A port nothing listens on (it did a moment ago). */
async function closedPort(): Promise<number> {
  const port = await listen(() => undefined);
  const s = servers.pop() as Server;
  await new Promise((r) => s.close(r));
  return port;
}

const request = (config: Record<string, unknown>): TrainRequest => ({
  runId: "r1",
  step: 0,
  attempt: 0,
  weightVersionIn: 0,
  checkpointUriIn: null,
  outputDir: "/nonexistent/step-0/attempt-0-x",
  config,
  batch: { runId: "r1", step: 0, samples: [] },
});

describe("remote trainer client: outages", () => {
  it("a refused connection is an outage: waited for up to trainer_unreachable_timeout_s, then a non-retriable error", async () => {
    const port = await closedPort();
    const waits: Array<number | null> = [];
    const trainer = createRemoteTrainer({ url: `http://127.0.0.1:${port}` });
    const err = await trainer
      .trainStep(request({ trainer_unreachable_timeout_s: 0.6 }), () => undefined, new AbortController().signal, { onOutage: (ms) => waits.push(ms) })
      .catch((e: unknown) => e);
    expect(err).toMatchObject({ code: "trainer_unreachable", isRetriable: false });
    expect(String((err as Error).message)).toMatch(/unreachable for \d+ s \(trainer_unreachable_timeout_s 0.6\)/);
    // Backoff 0.25 s, 0.5 s: a few tries inside the window, each reported.
    expect(waits.length).toBeGreaterThanOrEqual(2);
    expect(waits.every((w) => typeof w === "number")).toBe(true);
  });

  it("a trainer that connects but does not answer is a timeout (retried as an attempt), not an outage", async () => {
    const port = await listen(() => undefined); // accepts, never answers
    const waits: Array<number | null> = [];
    const trainer = createRemoteTrainer({ url: `http://127.0.0.1:${port}`, requestTimeoutMs: 200 });
    const err = await trainer
      .trainStep(request({}), () => undefined, new AbortController().signal, { onOutage: (ms) => waits.push(ms) })
      .catch((e: unknown) => e);
    expect(err).toMatchObject({ code: "trainer_timeout", isRetriable: true });
    expect(waits).toEqual([]);
  });

  it("shutdown ends the wait with worker_shutdown; a cancel ends it with train_cancelled", async () => {
    const port = await closedPort();
    for (const which of ["shutdown", "cancel"] as const) {
      const shutdown = new AbortController();
      const cancel = new AbortController();
      const trainer = createRemoteTrainer({ url: `http://127.0.0.1:${port}` });
      const err = await trainer
        .trainStep(request({ trainer_unreachable_timeout_s: 300 }), () => undefined, cancel.signal, {
          shutdown: shutdown.signal,
          onOutage: () => (which === "shutdown" ? shutdown : cancel).abort("test"),
        })
        .catch((e: unknown) => e);
      expect(err).toMatchObject(which === "shutdown" ? { code: "worker_shutdown", isRetriable: true } : { code: "train_cancelled", isRetriable: true });
    }
  });

  it("the outage ends when the trainer answers; a trainer that no longer knows the step lost the attempt", async () => {
    const port = await closedPort();
    const waits: Array<number | null> = [];
    let started = false;
    const trainer = createRemoteTrainer({ url: `http://127.0.0.1:${port}`, pollMs: 10 });
    const err = await trainer
      .trainStep(request({ trainer_unreachable_timeout_s: 60 }), () => undefined, new AbortController().signal, {
        onOutage: (ms) => {
          waits.push(ms);
          if (ms === null || started) return;
          started = true;
          // The trainer comes up (a restarted process): it takes the step, then has forgotten it.
          void listen((req, res) => {
            const status = { run_id: "r1", step: 0, attempt: "0", state: "running", progress: { done: 0, total: 1, phase: "queued" }, progress_seq: 0 };
            if (req.method === "POST") {
              res.writeHead(202, { "content-type": "application/json" }).end(JSON.stringify(status));
              return;
            }
            res
              .writeHead(404, { "content-type": "application/json" })
              .end(JSON.stringify({ error: { code: "not_found", message: "no such step", retryable: false } }));
          }, port);
        },
      })
      .catch((e: unknown) => e);
    expect(err).toMatchObject({ code: "trainer_lost_attempt", isRetriable: true });
    expect(waits.at(-1)).toBeNull();
    expect(waits.slice(0, -1).every((w) => typeof w === "number")).toBe(true);
  });

  it("names a trainer's protocol error by the table's code; a code outside the protocol is trainer_error with the trainer's code in its message", async () => {
    const running = { run_id: "r1", step: 0, attempt: "0", progress: { done: 0, total: 1, phase: "train" }, progress_seq: 1 };
    const answers = [
      { code: "oom", retryable: true, expected: "trainer_oom" },
      { code: "bad_request", retryable: false, expected: "trainer_bad_request" },
      { code: "cuda_graph_broke", retryable: true, expected: "trainer_error" },
    ];
    for (const a of answers) {
      const port = await listen((req, res) => {
        const failed = { ...running, state: "failed", error: { code: a.code, message: "as the trainer says", retryable: a.retryable } };
        res
          .writeHead(req.method === "POST" ? 202 : 200, { "content-type": "application/json" })
          .end(JSON.stringify(req.method === "POST" ? { ...running, state: "running" } : failed));
      });
      const err = await createRemoteTrainer({ url: `http://127.0.0.1:${port}`, pollMs: 10 })
        .trainStep(request({}), () => undefined, new AbortController().signal)
        .catch((e: unknown) => e);
      expect(err).toMatchObject({ code: a.expected, isRetriable: a.retryable });
      expect((err as Error).message).toContain(`${a.code}: as the trainer says`);
    }
    // A non-2xx answer without the protocol's error body: named by its status.
    const port = await listen((_req, res) => res.writeHead(503, { "content-type": "application/json" }).end(JSON.stringify({ detail: "warming up" })));
    const err = await createRemoteTrainer({ url: `http://127.0.0.1:${port}` })
      .trainStep(request({}), () => undefined, new AbortController().signal)
      .catch((e: unknown) => e);
    expect(err).toMatchObject({ code: "trainer_http_error", isRetriable: true });
  });

  it("classifies errors by their cause's code", () => {
    const refused = new TypeError("fetch failed", { cause: Object.assign(new Error("connect ECONNREFUSED"), { code: "ECONNREFUSED" }) });
    expect(isTrainerOutage(refused)).toBe(true);
    expect(isTrainerOutage(new DOMException("timed out", "TimeoutError"))).toBe(false);
    expect(isTrainerOutage(new TypeError("fetch failed", { cause: new Error("bad header") }))).toBe(false);
  });
});
