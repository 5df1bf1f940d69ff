import { describe, expect, it } from "vitest";
import type { Engine, GenerateRequest, GenerateResult } from "../engines/engine.ts";
import { createDemoTokenizer } from "../model/tokenizer.ts";
import { generate as toolAgent } from "../../examples/tool-agent/agent.ts";
import { parseRunConfig } from "../config/run-config.ts";
import { createByteTokenizer } from "../data/tokenizer.ts";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { solidPng } from "../../test/helpers/png.ts";
import { sha256Hex } from "../lib/hash.ts";
import { runCustomGenerate, type CustomGenerateBinding, type CustomGenerateFunction, type EngineTurn, type Turn } from "./custom-generate.ts";
import { encoderWithoutPrefix, generateCustomRound } from "./custom-generate-round.ts";

const tok = createDemoTokenizer();

/** A scripted engine: answers each call with the next text (and finish reason), records the requests. */
function scriptedEngine(script: Array<[string, GenerateResult["finishReason"]]>, weightVersion = 3): Engine & { requests: GenerateRequest[] } {
  const requests: GenerateRequest[] = [];
  return {
    id: "scripted",
    requests,
    async generate(req) {
      requests.push(req);
      const next = script.shift();
      if (!next) throw new Error("script exhausted");
      const [text, finishReason] = next;
      const ids = text === "<eos>" ? [tok.eosId] : text.endsWith("<eos>") ? [...tok.encode(text.slice(0, -5)), tok.eosId] : tok.encode(text);
      const tokenIds = ids.slice(0, req.sampling.maxNewTokens);
      return {
        tokenIds,
        logProbs: tokenIds.map((_, i) => -0.1 * (i + 1)),
        finishReason: tokenIds.length < ids.length ? "length" : finishReason,
        weightVersion,
        engineId: "scripted",
      };
    },
    abort: async () => undefined,
    health: async () => true,
    loadWeights: async () => undefined,
    weightVersion: async () => weightVersion,
    close: async () => undefined,
  };
}

function binding(engine: Engine, over: Partial<CustomGenerateBinding> = {}): CustomGenerateBinding {
  const promptTokens = tok.formatPrompt("3*4=");
  return {
    engine,
    args: { rollout_max_response_len: 32 },
    sample: {
      sampleIndex: 1,
      groupId: 7,
      round: 0,
      prompt: "3*4=",
      promptTokens,
      responseTokens: [],
      response: "",
      label: "12",
      metadata: {},
      status: "pending",
    },
    sampling: { temperature: 1, topP: 1, topK: -1, stopTokenIds: [tok.eosId] },
    budget: 32,
    firstSegmentIndex: 0,
    requestIdFor: (seg) => `run-7-1-${seg}`,
    seedFor: (seg) => 1000 + seg,
    fallbackWeightVersion: 3,
    tokenizer: { encode: (s) => tok.encode(s), decode: (ids) => tok.decode(ids) },
    ...over,
  };
}

describe("custom generate: the calculator agent on a scripted engine", () => {
  it("engine tokens mask 1 with log-probs, tool tokens mask 0 with log-prob 0, one segment per engine call", async () => {
    const engine = scriptedEngine([
      ["(3*4)", "stop"],
      ["\\boxed{12}<eos>", "stop"],
    ]);
    const out = await runCustomGenerate(toolAgent, binding(engine));
    expect(out.status).toBe("completed");
    expect(out.segments).toHaveLength(2);
    const [first, second] = out.segments as [(typeof out.segments)[0], (typeof out.segments)[0]];
    expect(tok.decode(first.tokens)).toBe("(3*4)=12");
    expect(first.lossMask).toEqual([1, 1, 1, 1, 1, 0, 0, 0]);
    expect(first.logProbs.slice(5)).toEqual([0, 0, 0]);
    expect(first.logProbs.slice(0, 5).every((l) => l < 0)).toBe(true);
    expect(first).toMatchObject({ segmentIndex: 0, weightVersion: 3, status: "pending", finishReason: "stop" });
    expect(second).toMatchObject({ segmentIndex: 1, weightVersion: 3, status: "completed", finishReason: "stop", lossMask: [1, 1, 1, 1, 1] });
    expect(out.appendedTokens).toBe(first.tokens.length + second.tokens.length);
    // The second call sees the tool output, has its own request id and seed, and a smaller budget.
    const [r0, r1] = engine.requests as [GenerateRequest, GenerateRequest];
    expect(r0.sampling.stopTokenIds).toEqual([tok.eosId, ...tok.encode(")")]);
    expect(r1.inputIds).toEqual([...tok.formatPrompt("3*4="), ...tok.encode("(3*4)=12")]);
    expect([r0.requestId, r1.requestId]).toEqual(["run-7-1-0", "run-7-1-1"]);
    expect([r0.sampling.seed, r1.sampling.seed]).toEqual([1000, 1001]);
    expect(r1.sampling.maxNewTokens).toBe(32 - 8);
  });

  it("continues a resumed sample from its response so far and numbers segments after it", async () => {
    const engine = scriptedEngine([["\\boxed{12}<eos>", "stop"]]);
    const resumed = binding(engine, { firstSegmentIndex: 2, budget: 24 });
    resumed.sample.responseTokens = tok.encode("(3*4)=12");
    resumed.sample.response = "(3*4)=12";
    const out = await runCustomGenerate(toolAgent, resumed);
    expect(out.segments.map((s) => s.segmentIndex)).toEqual([2]);
    expect(engine.requests[0]?.requestId).toBe("run-7-1-2");
    expect(engine.requests[0]?.inputIds.slice(-8)).toEqual(tok.encode("(3*4)=12"));
  });

  it("a budget that runs out mid-answer truncates; a tool output that does not fit is not appended", async () => {
    const engine = scriptedEngine([["(3*4)", "stop"]]);
    const out = await runCustomGenerate(toolAgent, binding(engine, { budget: 6 }));
    expect(out.status).toBe("truncated");
    expect(tok.decode(out.segments[0]?.tokens ?? [])).toBe("(3*4)");
    expect(out.segments[0]?.finishReason).toBe("length");
  });

  it("an abort ends the round: status aborted, later calls never reach the engine", async () => {
    const engine = scriptedEngine([["(3*", "abort"]]);
    const fn: CustomGenerateFunction = async (_a, _s, h) => {
      const a = await h.generate([]);
      const b = await h.generate([a]);
      return { turns: [a, b] };
    };
    const out = await runCustomGenerate(fn, binding(engine));
    expect(engine.requests).toHaveLength(1);
    expect(out.status).toBe("aborted");
    expect(out.segments).toHaveLength(1);
    expect(out.segments[0]).toMatchObject({ finishReason: "abort", status: "aborted", lossMask: [1, 1, 1] });
  });

  it("a round of tool tokens only is one segment at the job's version", async () => {
    const fn: CustomGenerateFunction = (_a, _s, h) => ({ turns: [h.tool("=5")], status: "completed" });
    const out = await runCustomGenerate(fn, binding(scriptedEngine([])));
    expect(out.segments).toEqual([
      {
        segmentIndex: 0,
        weightVersion: 3,
        tokens: tok.encode("=5"),
        logProbs: [0, 0],
        lossMask: [0, 0],
        finishReason: "stop",
        status: "completed",
        engine: "tool",
      },
    ]);
  });
});

describe("custom generate: what a plugin may return", () => {
  const run = (fn: CustomGenerateFunction, script: Array<[string, GenerateResult["finishReason"]]> = [["12<eos>", "stop"]]) =>
    runCustomGenerate(fn, binding(scriptedEngine(script)));

  it("rejects edited engine log-probs or tokens", async () => {
    await expect(
      run(async (_a, _s, h) => {
        const t = await h.generate([]);
        return { turns: [{ ...t, logProbs: t.logProbs.map(() => -0.0001) }] };
      }),
    ).rejects.toMatchObject({ code: "custom_generate_invalid", message: expect.stringContaining("cannot be edited") });
  });

  it("rejects a dropped engine turn and turns passed out of order", async () => {
    await expect(run(async (_a, _s, h) => (await h.generate([]), { turns: [] }))).rejects.toThrow(/generate\(\) was called 1 times/);
    await expect(
      run(
        async (_a, _s, h) => {
          await h.generate([]);
          return { turns: [await h.generate([])] };
        },
        [
          ["1", "stop"],
          ["2", "stop"],
        ],
      ),
    ).rejects.toThrow(/must be given every engine turn issued so far/);
  });

  it("rejects tool tokens with loss mask 1, mismatched lengths, and garbage", async () => {
    await expect(run(() => ({ turns: [{ kind: "tool", tokens: [3, 4], lossMask: [1, 1] }] }))).rejects.toMatchObject({
      code: "custom_generate_invalid",
      message: expect.stringContaining("turns.0"),
    });
    await expect(run(() => ({ turns: [{ kind: "tool", tokens: [3, 4], logProbs: [0] }] }))).rejects.toThrow(/custom_generate_invalid|expected \{turns/);
    await expect(run(() => undefined)).rejects.toThrow(/returned undefined; expected \{turns: \[...\], status\?\}/);
    const forged: EngineTurn = {
      kind: "engine",
      requestId: "x",
      tokens: [3],
      logProbs: [-1],
      weightVersion: 3,
      finishReason: "stop",
      engineId: "me",
      text: "0",
    };
    await expect(run(() => ({ turns: [forged] }))).rejects.toThrow(/returned 1 engine turns but generate\(\) was called 0 times/);
  });

  it("rejects a response that outgrows rollout_max_response_len", async () => {
    await expect(run((_a, _s, h) => ({ turns: [h.tool("1".repeat(40))] }))).rejects.toThrow(/over the 32 left of rollout_max_response_len/);
  });

  it("wraps a throw with the plugin's name", async () => {
    await expect(
      run(() => {
        throw new Error("tool crashed");
      }),
    ).rejects.toMatchObject({ code: "plugin_threw", message: "custom_generate_function_path (sample 1) threw: tool crashed" });
  });
});

describe("generateCustomRound: the rollout job's drop-in", () => {
  const config = parseRunConfig({
    prompt_data: "p.jsonl",
    rollout_batch_size: 1,
    rollout_max_response_len: 32,
    num_rollout: 1,
    rm_type: "math",
    ref_load: "ckpt",
    rollout_seed: 7,
  });
  const demo = { encode: (t: string) => tok.formatPrompt(t), decode: (ids: readonly number[]) => tok.decode(ids), eosId: tok.eosId };

  it("strips the BOS the run tokenizer prepends, for tool text", () => {
    expect(encoderWithoutPrefix(demo).encode("=12")).toEqual(tok.encode("=12"));
    expect(encoderWithoutPrefix(createByteTokenizer()).encode("ab")).toEqual([97, 98]);
  });

  it("continues a sample with the job's ids, seeds and budget; rows ready for writeRound", async () => {
    const engine = scriptedEngine([
      ["(3*4)", "stop"],
      ["\\boxed{12}<eos>", "stop"],
    ]);
    const inflight = new Set<string>();
    const rows = await generateCustomRound(
      toolAgent,
      engine,
      {
        runId: "r1",
        groupId: 4,
        round: 1,
        weightVersion: 3,
        config,
        tokenizer: demo,
        prompt: { prompt: "3*4=", promptTokens: tok.formatPrompt("3*4="), label: "12", metadata: null },
        sample: {
          sampleIndex: 2,
          responseTokens: tok.encode("1"),
          logProbs: [-1],
          lossMask: [1],
          denomMask: [1],
          tokenVersions: [3],
          weightVersions: [3],
          numSegments: 1,
          nextSegmentIndex: 1,
          oldestVersion: 3,
          status: "aborted",
          finishReason: "abort",
        },
        pluginPath: "examples/tool-agent/agent.ts",
      },
      inflight,
      () => false,
    );
    expect(rows.map((r) => [r.segmentIndex, r.tokenStart, r.round, r.sampleIndex, tok.decode(r.tokens), r.status])).toEqual([
      [1, 1, 1, 2, "(3*4)=12", "pending"],
      [2, 9, 1, 2, "\\boxed{12}", "completed"],
    ]);
    expect(engine.requests.map((r) => r.requestId)).toEqual(["r1-4-2-1", "r1-4-2-2"]);
    expect(engine.requests[0]?.sessionKey).toBe("r1-4-2");
    expect(engine.requests[0]?.sampling.maxNewTokens).toBe(31);
    expect(engine.requests[0]?.sampling.stopTokenIds).toEqual([tok.eosId, ...tok.encode(")")]);
    expect(inflight.size).toBe(0);
    expect(
      await generateCustomRound(
        toolAgent,
        null,
        {
          runId: "r1",
          groupId: 4,
          round: 1,
          weightVersion: 3,
          config,
          tokenizer: demo,
          prompt: { prompt: "", promptTokens: [1], label: null, metadata: {} },
          sample: {
            sampleIndex: 0,
            responseTokens: [],
            logProbs: [],
            lossMask: [],
            denomMask: [],
            tokenVersions: [],
            weightVersions: [],
            numSegments: 0,
            nextSegmentIndex: 0,
            oldestVersion: null,
            status: "pending",
            finishReason: "",
          },
          pluginPath: "x",
        },
        inflight,
        () => true,
      ),
    ).toEqual([]);
  });
});

describe("custom generate: a tool turn with an image (an image observation)", () => {
  const bytes = encoderWithoutPrefix(createByteTokenizer());
  const placeholder = "<img/>";
  const red = solidPng([255, 0, 0]);
  const blue = solidPng([0, 0, 255]);
  const promptImage = {
    type: "image",
    key: "images",
    sha256: sha256Hex(red),
    byteLength: red.byteLength,
    mime: "image/png",
    origin: "path" as const,
    path: "",
    source: "red.png",
  };

  it("puts the placeholder in the observation, masks it, records the image on its segment, and sends prompt + observation images after it", async () => {
    const dir = mkdtempSync(join(tmpdir(), "rlq-obs-"));
    writeFileSync(join(dir, "red.png"), red);
    const engine = scriptedEngine([
      ["(3*4)", "stop"],
      ["12<eos>", "stop"],
    ]);
    const fn: CustomGenerateFunction = async (_a, s, h) => {
      expect(s.imageHashes).toEqual([sha256Hex(red)]);
      expect(h.imagePlaceholder).toBe(placeholder);
      const turns: Turn[] = [];
      turns.push(await h.generate(turns));
      turns.push(h.tool("\nseen:", { images: [`data:image/png;base64,${blue.toString("base64")}`] }));
      turns.push(await h.generate(turns));
      return { turns };
    };
    const out = await runCustomGenerate(
      fn,
      binding(engine, {
        tokenizer: bytes,
        images: [{ ...promptImage, path: join(dir, "red.png") }],
        sample: { ...binding(engine).sample, imageHashes: [sha256Hex(red)] },
        imagePlaceholder: placeholder,
        imageLoad: { baseDir: dir, imageStoreDir: join(dir, "store") },
      }),
    );
    // The first call sends the prompt's image; the second the prompt's then the observation's, in order.
    expect(engine.requests.map((r) => (r.imageData ?? []).map((u) => sha256Hex(Buffer.from(u.split(",")[1] as string, "base64"))))).toEqual([
      [sha256Hex(red)],
      [sha256Hex(red), sha256Hex(blue)],
    ]);
    const obs = bytes.encode(`${placeholder}\nseen:`);
    const first = tok.encode("(3*4)");
    // The second request's ids end with the observation, its placeholder included (the engine expands it).
    expect(engine.requests[1]?.inputIds.slice(-obs.length)).toEqual(obs);
    expect(out.segments).toHaveLength(2);
    const [seg0, seg1] = out.segments;
    expect(seg0?.tokens).toEqual([...first, ...obs]);
    expect(seg0?.lossMask).toEqual([...first.map(() => 1), ...obs.map(() => 0)]);
    expect(seg0?.images).toEqual([
      {
        type: "image",
        key: "observation",
        sha256: sha256Hex(blue),
        byteLength: blue.byteLength,
        mime: "image/png",
        origin: "data_uri",
        path: join(dir, "store", sha256Hex(blue)),
        source: null,
      },
    ]);
    expect(readFileSync(join(dir, "store", sha256Hex(blue)))).toEqual(blue);
    expect(seg1?.images).toBeUndefined();
  });

  it("a path image is read from the image base directory; placeholders written in the text are kept where they are", async () => {
    const dir = mkdtempSync(join(tmpdir(), "rlq-obs-"));
    writeFileSync(join(dir, "blue.png"), blue);
    const fn: CustomGenerateFunction = (_a, _s, h) => ({ turns: [h.tool(`a ${placeholder} b`, { images: ["blue.png"] })], status: "completed" });
    const out = await runCustomGenerate(fn, binding(scriptedEngine([]), { tokenizer: bytes, imagePlaceholder: placeholder, imageLoad: { baseDir: dir } }));
    expect(out.segments[0]?.tokens).toEqual(bytes.encode(`a ${placeholder} b`));
    expect(out.segments[0]?.images?.map((i) => [i.origin, i.source, i.path])).toEqual([["path", "blue.png", join(dir, "blue.png")]]);
  });

  it("refuses placeholders that do not match the images, an unreadable image, and images on a run without a placeholder", async () => {
    const dir = mkdtempSync(join(tmpdir(), "rlq-obs-"));
    writeFileSync(join(dir, "blue.png"), blue);
    const run = (fn: CustomGenerateFunction, over: Partial<CustomGenerateBinding> = {}) =>
      runCustomGenerate(fn, binding(scriptedEngine([]), { tokenizer: bytes, imagePlaceholder: placeholder, imageLoad: { baseDir: dir }, ...over }));
    await expect(run((_a, _s, h) => ({ turns: [h.tool(`${placeholder}`, { images: ["blue.png", "blue.png"] })] }))).rejects.toMatchObject({
      code: "custom_generate_invalid",
      message: expect.stringMatching(/2 image\(s\) holds 1 image placeholder/),
    });
    await expect(run((_a, _s, h) => ({ turns: [h.tool(bytes.encode("no image"), { images: ["blue.png"] })] }))).rejects.toMatchObject({
      message: expect.stringMatching(/1 image\(s\) holds 0 image placeholder/),
    });
    await expect(run((_a, _s, h) => ({ turns: [h.tool("x", { images: ["none.png"] })] }))).rejects.toMatchObject({
      code: "custom_generate_invalid",
      message: expect.stringMatching(/tool image 0: image none.png cannot be read/),
    });
    await expect(run((_a, _s, h) => ({ turns: [h.tool("x", { images: ["blue.png"] })] }), { imagePlaceholder: null })).rejects.toMatchObject({
      message: expect.stringMatching(/needs a chat template that renders image parts/),
    });
  });

  it("a resumed sample (generateCustomRound) sends the prompt's images then its earlier observations'", async () => {
    const dir = mkdtempSync(join(tmpdir(), "rlq-obs-"));
    writeFileSync(join(dir, "red.png"), red);
    writeFileSync(join(dir, "blue.png"), blue);
    const red0 = { ...promptImage, path: join(dir, "red.png") };
    const blue0 = { ...promptImage, key: "observation", sha256: sha256Hex(blue), byteLength: blue.byteLength, path: join(dir, "blue.png"), source: "blue.png" };
    const engine = scriptedEngine([["12<eos>", "stop"]]);
    let seen: string[] | undefined;
    const fn: CustomGenerateFunction = async (_a, s, h) => {
      seen = s.imageHashes;
      const turns: Turn[] = [];
      turns.push(await h.generate(turns));
      return { turns };
    };
    const config = parseRunConfig({
      prompt_data: "p.jsonl",
      rollout_batch_size: 1,
      rollout_max_response_len: 32,
      num_rollout: 1,
      rm_type: "math",
      ref_load: "ckpt",
    });
    const rows = await generateCustomRound(
      fn,
      engine,
      {
        runId: "r1",
        groupId: 4,
        round: 1,
        weightVersion: 3,
        config,
        tokenizer: { ...bytes, eosId: 257 },
        prompt: { prompt: "?", promptTokens: [1, 2], label: null, metadata: {}, images: [red0] },
        sample: {
          sampleIndex: 0,
          responseTokens: [3, 4],
          logProbs: [-1, 0],
          lossMask: [1, 0],
          denomMask: [1, 0],
          tokenVersions: [3, -1],
          weightVersions: [3],
          numSegments: 1,
          nextSegmentIndex: 1,
          oldestVersion: 3,
          status: "aborted",
          finishReason: "abort",
          images: [blue0],
        },
        pluginPath: "agent.mjs",
        imagePlaceholder: placeholder,
      },
      new Set(),
      () => false,
    );
    expect(seen).toEqual([sha256Hex(red), sha256Hex(blue)]);
    expect(engine.requests[0]?.imageData?.map((u) => sha256Hex(Buffer.from(u.split(",")[1] as string, "base64")))).toEqual([sha256Hex(red), sha256Hex(blue)]);
    expect(rows.map((r) => r.images)).toEqual([undefined]);
  });

  it("a text-only run sends no image data and records no images", async () => {
    const engine = scriptedEngine([["(3*4)", "stop"]]);
    const fn: CustomGenerateFunction = async (_a, s, h) => {
      expect("imageHashes" in s).toBe(false);
      const turns: Turn[] = [];
      turns.push(await h.generate(turns));
      turns.push(h.tool("=12"));
      return { turns };
    };
    const out = await runCustomGenerate(fn, binding(engine));
    expect(engine.requests[0]).not.toHaveProperty("imageData");
    expect(out.segments[0]).not.toHaveProperty("images");
  });
});
