import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { checkTrainerCapabilities, requiredCapabilities } from "./capabilities.ts";
import { createRemoteTrainer } from "./remote-trainer.ts";
import type { TrainRequest } from "./trainer.ts";

/**
 * rlq refuses `advantage_estimator: ppo` unless the trainer declares a critic in /v1/health
 * (workers/trainer-torch/rlq_torch/capabilities.py answers `capabilities.critic`), against
 * real HTTP servers on 127.0.0.1 answering as server.py does.
 */
const servers: Server[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => new Promise((r) => s.close(r))));
});

/** A trainer whose health answers `health`; records the requests; takes a step and finishes it at once. */
async function trainer(health: Record<string, unknown>): Promise<{ url: string; seen: string[] }> {
  const seen: string[] = [];
  const s = createServer((req, res) => {
    seen.push(`${req.method} ${req.url}`);
    if (req.url === "/v1/health") return void res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(health));
    const status = {
      run_id: "r1",
      step: 0,
      attempt: "0",
      state: "done",
      progress: { done: 1, total: 1, phase: "done" },
      progress_seq: 3,
      error: null,
      result: { weight_version_out: 1, checkpoint_uri: "file:///ckpt/step-0/attempt-0-x", num_samples: 1, num_tokens: 1, metrics: { value_loss: 0.5 } },
    };
    res.writeHead(req.method === "POST" ? 202 : 200, { "content-type": "application/json" }).end(JSON.stringify(status));
  });
  servers.push(s);
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
  return { url: `http://127.0.0.1:${(s.address() as AddressInfo).port}`, seen };
}

const request = (config: Record<string, unknown>): TrainRequest => ({
  runId: "r1",
  step: 0,
  attempt: 0,
  weightVersionIn: 0,
  checkpointUriIn: null,
  outputDir: "/ckpt/step-0/attempt-0-x",
  config,
  batch: { runId: "r1", step: 0, samples: [] },
});

describe("trainer capabilities", () => {
  it("ppo against a trainer without a critic: refused before the step is sent, not retriable, saying what to do", async () => {
    for (const health of [{ ok: true }, { ok: true, capabilities: { critic: false, sequence_packing: true } }]) {
      const t = await trainer(health);
      const err = await createRemoteTrainer({ url: t.url, pollMs: 10 })
        .trainStep(request({ advantage_estimator: "ppo" }), () => undefined, new AbortController().signal)
        .catch((e: unknown) => e);
      expect(err).toMatchObject({ code: "trainer_unsupported", isRetriable: false });
      expect(String((err as Error).message)).toMatch(/ppo needs a critic.*capabilities\.critic: true.*workers\/trainer-torch.*grpo/);
      expect(t.seen).toEqual(["GET /v1/health"]); // nothing was trained
    }
  });

  it("ppo against a trainer with a critic trains; grpo never asks", async () => {
    const t = await trainer({ ok: true, capabilities: { critic: true } });
    const r = await createRemoteTrainer({ url: t.url, pollMs: 10 }).trainStep(
      request({ advantage_estimator: "ppo" }),
      () => undefined,
      new AbortController().signal,
    );
    expect(r.metrics.value_loss).toBe(0.5);
    expect(t.seen[0]).toBe("GET /v1/health");
    expect(t.seen[1]).toBe("POST /v1/steps");
    const g = await trainer({ ok: true });
    await createRemoteTrainer({ url: g.url, pollMs: 10 }).trainStep(request({ advantage_estimator: "grpo" }), () => undefined, new AbortController().signal);
    expect(g.seen).not.toContain("GET /v1/health");
  });

  it("requiredCapabilities / checkTrainerCapabilities", () => {
    expect(requiredCapabilities({ advantage_estimator: "grpo" })).toEqual([]);
    expect(requiredCapabilities({ advantage_estimator: "ppo" })).toEqual(["critic"]);
    expect(() => checkTrainerCapabilities("not json", { advantage_estimator: "ppo" }, "x")).toThrow(/needs a critic/);
    expect(() => checkTrainerCapabilities({ capabilities: { critic: true } }, { advantage_estimator: "ppo" }, "x")).not.toThrow();
  });
});
