import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { backoffMs, createRemoteReward, remoteRewardFunction, RemoteRewardError, type AttemptFailure } from "./remote.ts";

// A fake reward server: a real HTTP server on 127.0.0.1 so the real client runs.
type Handler = (body: Record<string, unknown>, n: number, res: ServerResponse) => void;
const servers: Server[] = [];

async function serve(handler: Handler): Promise<{ url: string; bodies: Array<Record<string, unknown>> }> {
  const bodies: Array<Record<string, unknown>> = [];
  const server = createServer((req: IncomingMessage, res) => {
    let data = "";
    req.on("data", (c: Buffer) => (data += c.toString()));
    req.on("end", () => {
      const body = JSON.parse(data) as Record<string, unknown>;
      bodies.push(body);
      handler(body, bodies.length, res);
    });
  });
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/reward`, bodies };
}

afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => new Promise((r) => s.close(r))));
});

const json = (res: ServerResponse, status: number, value: unknown) => {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify(value));
};

/** Instant sleeps that record the backoff delays; a fixed jitter. */
function fastRetry() {
  const delays: number[] = [];
  const failures: AttemptFailure[] = [];
  return {
    delays,
    failures,
    options: { sleep: async (ms: number) => void delays.push(ms), random: () => 0.5, onAttemptFailed: (f: AttemptFailure) => void failures.push(f) },
  };
}

describe("remote_rm", () => {
  it("POSTs {prompt, response, label} per sample and returns the JSON reward", async () => {
    const { url, bodies } = await serve((b, _n, res) => json(res, 200, b.response === "\\boxed{3}" ? { score: 1, pred: "3" } : 0));
    const rm = createRemoteReward({ url });
    const out = await rm.scoreGroup([
      { prompt: "1+2=", response: "\\boxed{3}", label: "3" },
      { prompt: "1+2=", response: "\\boxed{4}", label: "3" },
    ]);
    expect(out).toEqual([{ score: 1, pred: "3" }, 0]);
    expect(bodies).toContainEqual({ prompt: "1+2=", response: "\\boxed{4}", label: "3" });
    const fn = remoteRewardFunction({ url });
    expect(await fn({ prompt: "p", response: "\\boxed{3}", label: null })).toEqual({ score: 1, pred: "3" });
  });

  it("retries 500s and garbage with slime's backoff, then succeeds", async () => {
    const { url } = await serve((_b, n, res) => {
      if (n === 1) json(res, 500, { detail: "model warming up" });
      else if (n === 2) {
        res.writeHead(200, { "content-type": "text/html" });
        res.end("<html>bad gateway</html>");
      } else json(res, 200, true);
    });
    const r = fastRetry();
    const out = await createRemoteReward({ url, ...r.options }).scoreSample({ prompt: "p", response: "r", label: "l" });
    expect(out).toBe(1); // a boolean reward becomes 1/0 (plugin contract)
    expect(r.delays).toEqual([backoffMs(0, 0.5), backoffMs(1, 0.5)]);
    expect(r.delays).toEqual([1500, 2500]);
    expect(r.failures.map((f) => [f.status, f.error])).toEqual([
      [500, "status 500 Internal Server Error"],
      [200, "the body is not JSON"],
    ]);
  });

  it("backoff is min(2^a, 30) + U(0,1) seconds", () => {
    expect([0, 1, 4, 5, 9].map((a) => backoffMs(a, 0))).toEqual([1000, 2000, 16000, 30000, 30000]);
    expect(backoffMs(3, 0.999)).toBeCloseTo(8999);
  });

  it("gives up after maxAttempts with a record naming the URL, the status and the body", async () => {
    const { url, bodies } = await serve((_b, _n, res) => json(res, 503, { error: "overloaded: queue full" }));
    const r = fastRetry();
    const err = await createRemoteReward({ url, ...r.options })
      .scoreSample({ prompt: "p", response: "r", label: null }, 4)
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RemoteRewardError);
    const e = err as RemoteRewardError;
    expect(bodies).toHaveLength(10);
    expect(r.delays).toHaveLength(9);
    expect(e.isRetriable).toBe(true); // the reward job retries later: the sample is not lost
    expect(e.code).toBe("remote_reward_failed");
    expect(e.message).toContain(`remote_rm POST ${url} for sample 4 gave up after 10 tries`);
    expect(e.message).toContain('HTTP 503, status 503 Service Unavailable, body: "{\\"error\\":\\"overloaded: queue full\\"}"');
    expect(e.record).toMatchObject({ url, attempts: 10, status: 503, bodyExcerpt: '{"error":"overloaded: queue full"}', sampleIndex: 4 });
  });

  it("does not retry a 4xx refusal", async () => {
    const { url, bodies } = await serve((_b, _n, res) => json(res, 422, { error: "label missing" }));
    const err = (await createRemoteReward({ url, ...fastRetry().options })
      .scoreSample({ prompt: "p", response: "r", label: null })
      .catch((e: unknown) => e)) as RemoteRewardError;
    expect(bodies).toHaveLength(1);
    expect(err.isRetriable).toBe(false);
    expect(err.message).toContain("refused the request (not retried): HTTP 422");
  });

  it("times out a slow server per try and stops at the total budget", async () => {
    const { url } = await serve(() => undefined); // never answers
    const r = fastRetry();
    const err = (await createRemoteReward({ url, requestTimeoutMs: 50, totalTimeoutMs: 1200, ...r.options })
      .scoreSample({ prompt: "p", response: "r", label: null })
      .catch((e: unknown) => e)) as RemoteRewardError;
    expect(err.record.status).toBeNull();
    expect(err.record.error).toBe("timed out after 50 ms");
    // The first backoff (1.5 s) would overrun the 1.2 s budget: one try only.
    expect(err.record.attempts).toBe(1);
  });

  it("a dead server is a network error, retried, then a clear failure", async () => {
    const { url } = await serve(() => undefined);
    await Promise.all(servers.splice(0).map((s) => new Promise((r) => s.close(r))));
    const err = (await createRemoteReward({ url, maxAttempts: 3, ...fastRetry().options })
      .scoreSample({ prompt: "p", response: "r", label: null })
      .catch((e: unknown) => e)) as RemoteRewardError;
    expect(err.record.attempts).toBe(3);
    expect(err.message).toMatch(/no HTTP status, .*ECONNREFUSED/);
  });

  it("a JSON answer of the wrong shape is a non-retriable contract error naming rm_url", async () => {
    const { url } = await serve((_b, _n, res) => json(res, 200, { score: null }));
    await expect(createRemoteReward({ url }).scoreSample({ prompt: "p", response: "r", label: null }, 2)).rejects.toMatchObject({
      code: "plugin_reward_invalid",
      isRetriable: false,
      message: expect.stringContaining(`rm_url ${url} returned {"score":null} for sample 2`),
    });
    expect(() => createRemoteReward({ url: "localhost:8000" })).toThrow(/expected an http/);
  });
});
