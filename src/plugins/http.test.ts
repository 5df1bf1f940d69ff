import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Engine, GenerateRequest } from "../engines/engine.ts";
import { createByteTokenizer } from "../data/tokenizer.ts";
import { encoderWithoutPrefix } from "../rollout/custom-generate-round.ts";
import { sha256Hex } from "../lib/hash.ts";
import { solidPng } from "../../test/helpers/png.ts";
import { createDemoTokenizer } from "../model/tokenizer.ts";
import { validatePluginGroupReward, validatePluginReward } from "../reward/plugin-contract.ts";
import { toDynamicFilterOutput } from "../filters/dynamic-filter.ts";
import { runCustomGenerate } from "../rollout/custom-generate.ts";
import { httpBufferFilter, httpCustomGenerate, httpDynamicFilter, httpReward, httpRewardGroup, isHttpPluginPath, resolvePluginFunction } from "./http.ts";

// An HTTP plugin written in-process for the unit tests; the Python example server is exercised in test/integration/plugins-http.test.ts.
interface Body {
  kind: string;
  sample: { response: string };
  samples: unknown[];
  buffer: unknown[];
  n: number;
  turns: Array<{ kind: string; text?: string }>;
}
const servers: Server[] = [];
async function serve(handler: (body: Body) => [number, unknown]): Promise<{ url: string; bodies: Body[] }> {
  const bodies: Body[] = [];
  const server = createServer((req, res) => {
    let data = "";
    req.on("data", (c: Buffer) => (data += c.toString()));
    req.on("end", () => {
      const body = JSON.parse(data) as Body;
      bodies.push(body);
      const [status, value] = handler(body);
      res.writeHead(status, { "content-type": "application/json" });
      res.end(JSON.stringify(value));
    });
  });
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/plugin`, bodies };
}
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => new Promise((r) => s.close(r))));
});
const fast = { sleep: async () => undefined, random: () => 0 };

describe("HTTP plugins", () => {
  it("recognises URLs as plugin paths", () => {
    expect(isHttpPluginPath("http://127.0.0.1:8000/reward")).toBe(true);
    expect(isHttpPluginPath("HTTPS://rm.example/x")).toBe(true);
    expect(isHttpPluginPath("./plugins/reward.ts")).toBe(false);
    expect(isHttpPluginPath(null)).toBe(false);
  });

  it("reward and group reward speak {kind, args, sample(s)} → {result}, validated like a module", async () => {
    const { url, bodies } = await serve((b) =>
      b.kind === "reward"
        ? [200, { result: { score: b.sample.response === "42" ? 1 : 0, pred: b.sample.response } }]
        : [200, { result: b.samples.map(() => true) }],
    );
    const args = { rm_type: null, reward_key: "score" };
    const r = await httpReward(url)(args, { sampleIndex: 0, prompt: "p", response: "42", label: "42", metadata: {}, status: "completed" });
    expect(validatePluginReward(r, { path: url })).toEqual({ score: 1, pred: "42" });
    expect(bodies[0]).toEqual({
      kind: "reward",
      args,
      sample: { sampleIndex: 0, prompt: "p", response: "42", label: "42", metadata: {}, status: "completed" },
    });
    const g = await httpRewardGroup(url)(args, [{ response: "a" }, { response: "b" }]);
    expect(validatePluginGroupReward(g, 2, { path: url })).toEqual([1, 1]);
  });

  it("filters: dynamic filter output and buffer filter selection", async () => {
    const { url, bodies } = await serve((b) =>
      b.kind === "dynamic_filter" ? [200, { result: { keep: false, reason: "zero_std" } }] : [200, { result: b.buffer.slice(0, b.n) }],
    );
    expect(toDynamicFilterOutput(await httpDynamicFilter(url)({}, { groupId: 3, rewards: [1, 1], samples: [] }))).toEqual({
      keep: false,
      reason: "zero_std",
      keep_when_insufficient: false,
    });
    expect(await httpBufferFilter(url)({}, null, [{ groupId: "1" }, { groupId: "2" }], 1)).toEqual([{ groupId: "1" }]);
    expect(bodies[1]).toMatchObject({ kind: "buffer_filter", rollout_id: null, n: 1 });
  });

  it("names the URL on a missing result, a plugin error, and a dead endpoint", async () => {
    const { url } = await serve((b) => (b.sample.response === "x" ? [200, { score: 1 }] : [400, { error: "label must be a number" }]));
    await expect(httpReward(url, { option: "custom_rm_path" })({}, { response: "x" })).rejects.toMatchObject({
      code: "plugin_bad_return",
      message: `custom_rm_path ${url} answered {"score":1}; expected {"result": ...} or {"error": "..."}`,
    });
    await expect(httpReward(url, fast)({}, { response: "y" })).rejects.toMatchObject({
      code: "plugin_http_failed",
      isRetriable: false,
      message: expect.stringContaining("HTTP 400"),
    });
    const { url: ok } = await serve(() => [200, { error: "reward model crashed" }]);
    await expect(httpReward(ok)({}, {})).rejects.toMatchObject({ code: "plugin_threw", message: `reward ${ok} (reward) failed: reward model crashed` });
    await Promise.all(servers.splice(0).map((s) => new Promise((r) => s.close(r))));
    await expect(httpReward(url, { ...fast, maxAttempts: 2 })({}, {})).rejects.toMatchObject({
      code: "plugin_http_failed",
      isRetriable: true,
      record: { url, attempts: 2 },
    });
  });

  it("resolvePluginFunction: URL → HTTP client, otherwise the module loader", async () => {
    const { url } = await serve(() => [200, { result: 0.5 }]);
    const fn = await resolvePluginFunction<(a: unknown, s: unknown) => Promise<unknown>>(url, "/", "reward", "custom_rm_path");
    expect(await fn({}, {})).toBe(0.5);
    await expect(resolvePluginFunction("./nope.mjs", "/tmp", "reward", "custom_rm_path")).rejects.toMatchObject({ code: "plugin_load_failed" });
  });
});

describe("HTTP custom generate (step protocol)", () => {
  const tok = createDemoTokenizer();
  const engine: Engine = {
    id: "scripted",
    generate: async (req) => {
      const text = req.inputIds.length === 5 ? "(3*4)" : "\\boxed{12}";
      const tokenIds = tok.encode(text).slice(0, req.sampling.maxNewTokens);
      return { tokenIds, logProbs: tokenIds.map(() => -0.5), finishReason: "stop", weightVersion: 2, engineId: "scripted" };
    },
    abort: async () => undefined,
    health: async () => true,
    loadWeights: async () => undefined,
    weightVersion: async () => 2,
    close: async () => undefined,
  };
  const binding = {
    engine,
    args: {},
    sample: {
      sampleIndex: 0,
      groupId: 1,
      round: 0,
      prompt: "3*4=",
      promptTokens: tok.formatPrompt("3*4="),
      responseTokens: [],
      response: "",
      label: null,
      metadata: {},
      status: "pending" as const,
    },
    sampling: { temperature: 1, topP: 1, topK: -1, stopTokenIds: [tok.eosId] },
    budget: 20,
    firstSegmentIndex: 0,
    requestIdFor: (s: number) => `r-${s}`,
    seedFor: (s: number) => s,
    fallbackWeightVersion: 2,
    tokenizer: { encode: (s: string) => tok.encode(s), decode: (ids: readonly number[]) => tok.decode(ids) },
  };

  it("drives the agent one step per request; tool text gets mask 0", async () => {
    const { url, bodies } = await serve((b) => {
      const last = b.turns[b.turns.length - 1];
      if (!last) return [200, { result: { action: "generate", extra_stop_token_ids: tok.encode(")") } }];
      if (last.kind === "engine" && last.text?.endsWith(")")) return [200, { result: { action: "tool", text: "=12" } }];
      if (last.kind === "tool") return [200, { result: { action: "generate" } }];
      return [200, { result: { action: "finish" } }];
    });
    const out = await runCustomGenerate(httpCustomGenerate(url), binding);
    expect(out.status).toBe("completed");
    expect(out.segments.map((s) => tok.decode(s.tokens))).toEqual(["(3*4)=12", "\\boxed{12}"]);
    expect(out.segments[0]?.lossMask).toEqual([1, 1, 1, 1, 1, 0, 0, 0]);
    expect(bodies).toHaveLength(4);
    expect(bodies[3]).toMatchObject({ kind: "generate", remaining_tokens: 20 - 8 - 4 });
  });

  it("a tool step with images: rlq loads them, puts one placeholder each, and sends them with the next engine call", async () => {
    const dir = mkdtempSync(join(tmpdir(), "rlq-http-obs-"));
    const png = solidPng([0, 255, 0]);
    writeFileSync(join(dir, "g.png"), png);
    const bytes = encoderWithoutPrefix(createByteTokenizer());
    const requests: GenerateRequest[] = [];
    const imgEngine: Engine = {
      ...engine,
      async generate(req) {
        requests.push(req);
        return { tokenIds: [65], logProbs: [-0.5], finishReason: "stop", weightVersion: 2, engineId: "e" };
      },
    };
    const { url, bodies } = await serve((b) => {
      if (b.turns.length === 0) return [200, { result: { action: "tool", text: "see:", images: ["g.png"] } }];
      if (b.turns.length === 1) return [200, { result: { action: "generate" } }];
      return [200, { result: { action: "finish" } }];
    });
    const out = await runCustomGenerate(httpCustomGenerate(url), {
      ...binding,
      engine: imgEngine,
      tokenizer: bytes,
      imagePlaceholder: "<img/>",
      imageLoad: { baseDir: dir },
    });
    expect(bodies[0]).toMatchObject({ image_placeholder: "<img/>" });
    expect(out.segments[0]?.tokens).toEqual([...bytes.encode("<img/>see:"), 65]);
    expect(out.segments[0]?.images?.map((i) => i.sha256)).toEqual([sha256Hex(png)]);
    expect(requests[0]?.imageData).toEqual([`data:image/png;base64,${png.toString("base64")}`]);
  });

  it("rejects an unknown action with the URL", async () => {
    const { url } = await serve(() => [200, { result: { action: "think" } }]);
    await expect(runCustomGenerate(httpCustomGenerate(url), binding)).rejects.toMatchObject({
      code: "custom_generate_invalid",
      message: expect.stringContaining(`custom_generate_function_path ${url} answered {"action":"think"}`),
    });
  });
});
