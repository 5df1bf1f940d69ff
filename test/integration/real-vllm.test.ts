import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { fixtureModel, startVllm, type Server } from "../../scripts/real-stack.ts";
import { loadHfTokenizer } from "../../src/engines/hf-tokenizer.ts";
import { createOpenAiCompatEngine, type OpenAiCompatEngine } from "../../src/engines/openai-compat.ts";
import { createVllmInPlaceEngine } from "../../src/engines/vllm-in-place.ts";
import type { GenerateResult } from "../../src/engines/engine.ts";
import { emptyPartial, type PartialOutput } from "../../src/engines/remote.ts";
import { engineHarness } from "../helpers/engine-harness.ts";
import { repoRoot, runCommand, waitFor } from "../helpers/processes.ts";
import { requirePythonModules } from "../helpers/python.ts";
import { request } from "../fakes/fake-engine-control.ts";

/**
 * rlq's OpenAI-compatible adapter (src/engines/openai-compat.ts) against a real vLLM server
 * (vLLM 0.32.0's CPU build, `python -m vllm.entrypoints.openai.api_server` on the fixture model,
 * with --api-key), and the same requests against test/fakes/fake-vllm.ts: each check asserts what
 * the real server answers and that the fake answers alike (status, error body, finish reason,
 * field names), so the fake, kept for faults on cue (engines-openai.test.ts), is never kinder.
 *
 * One server for the whole file (starting it is most of the file's time). Its context is widened
 * to MAX_MODEL_LEN positions (--hf-overrides; the fixture model was built for 128) so that a
 * generation past the end of turn (ignore_eos) runs a thousand tokens, and it is paced (a 5 ms sleep
 * before each engine step, test/helpers/vllm_step_pace.py) so that a cut sent at the first streamed
 * token lands mid-request on a loaded 2-core machine.
 */
const python = requirePythonModules(["vllm"]);
const KEY = "rlq-real-vllm-key";
const MODEL = "fixture";
const MAX_MODEL_LEN = 1024;
/** Token ids both models know (the fixture's vocabulary has 283, the fake's 258). */
const longPrompt = (n: number) => Array.from({ length: n }, (_, i) => 3 + ((i * 7) % 240));

const h = engineHarness("vllm");
interface Target {
  name: "vllm" | "fake";
  url: string;
  eosId: number;
  /** A chat prompt for the fixture model, bytes for the fake. */
  prompt: number[];
}
const targets: Target[] = [];
let vllm: Server | undefined;

function engine(t: Target, options: { apiKey?: string | null; model?: string } = {}): OpenAiCompatEngine {
  return createOpenAiCompatEngine({
    url: t.url,
    model: options.model ?? MODEL,
    requestTimeoutMs: 60_000,
    ...(options.apiKey === null ? {} : { apiKey: options.apiKey ?? KEY }),
  });
}

async function poolOf(t: Target) {
  const p = h.pool([engine(t)], { healthTimeoutMs: 10_000 });
  await p.awaitReady(60_000);
  return p;
}

async function raw(t: Target, path: string, body?: unknown, headers: Record<string, string> = { authorization: `Bearer ${KEY}` }) {
  const res = await fetch(`${t.url}${path}`, {
    method: body === undefined ? "GET" : "POST",
    headers: { ...headers, ...(body === undefined ? {} : { "content-type": "application/json" }) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  let json: unknown = null;
  try {
    json = JSON.parse(text) as unknown;
  } catch {
    // not JSON (SSE, Prometheus text, an empty body): `text` holds it
  }
  return { status: res.status, text, json: json as Record<string, unknown> | null, contentType: res.headers.get("content-type") ?? "" };
}

/** The body rlq's adapter sends (openai-compat.ts `body`), for the checks that read raw answers. */
function rlqBody(prompt: number[], extra: Record<string, unknown> = {}) {
  return {
    model: MODEL,
    prompt,
    max_tokens: 6,
    temperature: 1,
    top_p: 1,
    top_k: -1,
    seed: 1,
    stop_token_ids: [],
    include_stop_str_in_output: true,
    skip_special_tokens: false,
    spaces_between_special_tokens: false,
    logprobs: 1,
    return_tokens_as_token_ids: true,
    return_token_ids: true,
    n: 1,
    stream: false,
    ...extra,
  };
}

/** Sorted field names of an answer, its first choice, its logprobs and usage: the shape rlq parses. */
function shape(answer: unknown) {
  const a = answer as Record<string, Record<string, unknown>[] & Record<string, unknown>>;
  const choice = (a.choices as unknown as Record<string, unknown>[])[0] ?? {};
  const keys = (o: unknown) => (o && typeof o === "object" ? Object.keys(o).sort() : o);
  return { top: keys(a), choice: keys(choice), logprobs: keys(choice.logprobs), usage: keys(a.usage) };
}

function sseEvents(text: string): unknown[] {
  return text
    .split("\n")
    .filter((l) => l.startsWith("data: ") && l !== "data: [DONE]")
    .map((l) => JSON.parse(l.slice(6)) as unknown);
}

/** The vLLM series rlq's checks wait on (vllm/v1/metrics/loggers.py), summed over label sets. */
async function metrics(t: Target) {
  const { text } = await raw(t, "/metrics", undefined, {});
  const sum = (name: string) => {
    let n = 0;
    for (const line of text.split("\n")) if (line.startsWith(`${name}{`)) n += Number(line.slice(line.lastIndexOf(" ") + 1));
    return n;
  };
  return { running: sum("vllm:num_requests_running"), generated: sum("vllm:generation_tokens_total") };
}

function checkTokens(r: GenerateResult) {
  expect(r.logProbs.length).toBe(r.tokenIds.length);
  for (const lp of r.logProbs) expect(Number.isFinite(lp) && lp <= 0).toBe(true);
}

/**
 * Cut a generation with `cut` once its first token has reached the client, and return the result.
 * The server is paced (startVllm stepPaceMs; the fake's --token-delay-ms), so its tokens stream out
 * as they are made and the cut lands while the request runs, however loaded the machine.
 */
async function cutMidStream(
  t: Target,
  run: (id: string) => { result: Promise<GenerateResult>; tokens: () => number },
  cut: (id: string) => Promise<void>,
  maxNewTokens: number,
): Promise<GenerateResult> {
  // Earlier requests (a pool's admission probe, the last test's) done first.
  await waitFor(`nothing running on ${t.name} before the cut`, async () => (await metrics(t)).running === 0);
  const before = await metrics(t);
  const id = `cut-${t.name}`;
  let settled = false;
  const { result, tokens } = run(id);
  const pending = result.finally(() => (settled = true));
  await waitFor(`${id}: a token streamed`, async () => settled || tokens() >= 1, 120_000, 1);
  expect(settled, `${id} ended before its first token reached the client`).toBe(false);
  await cut(id);
  const r = await pending;
  console.log(`${id}: ${r.finishReason} after ${r.tokenIds.length} of ${maxNewTokens} token(s)`);
  expect(r.finishReason, t.name).toBe("abort");
  // Aborted server-side: nothing runs, and the request stopped short of the tokens it would have
  // generated had it run to its end (ignore_eos: exactly maxNewTokens). Counted in tokens rather
  // than in finished requests: the counters of the request before this one (an admission probe)
  // may land after `running` reads 0, and a late +1 there is no fault of the abort.
  await waitFor(`nothing running on ${t.name}`, async () => (await metrics(t)).running === 0);
  expect((await metrics(t)).generated - before.generated, `${t.name}: tokens the server generated for the aborted request`).toBeLessThan(maxNewTokens);
  return r;
}

describe("the real vLLM server, and the fake held to it", () => {
  beforeAll(async () => {
    const model = await fixtureModel(python);
    const tok = await loadHfTokenizer(model);
    const [server, fake] = await Promise.all([
      startVllm({
        python,
        model,
        servedModelName: MODEL,
        apiKey: KEY,
        maxModelLen: MAX_MODEL_LEN,
        extraArgs: ["--hf-overrides", JSON.stringify({ max_position_embeddings: MAX_MODEL_LEN })],
        stepPaceMs: 5,
      }),
      h.fake(["--model", MODEL, "--api-key", KEY, "--max-model-len", String(MAX_MODEL_LEN), "--token-delay-ms", "3", "--stop-prob", "0.03"]),
    ]);
    vllm = server;
    targets.push({ name: "vllm", url: server.url, eosId: tok.eosId, prompt: tok.encodeChat([{ role: "user", content: "13+81=" }]) });
    targets.push({ name: "fake", url: fake.url, eosId: 257, prompt: [256, 49, 51, 43, 56, 49, 61] });
  }, 600_000);

  afterAll(async () => {
    await vllm?.stop();
  });

  it("/v1/models lists the served name; checkServer refuses another", async () => {
    for (const t of targets) {
      const models = await raw(t, "/v1/models");
      expect(models.status, t.name).toBe(200);
      expect(models.json, t.name).toMatchObject({ object: "list", data: [{ id: MODEL, object: "model", max_model_len: MAX_MODEL_LEN }] });
      await expect(engine(t).checkServer()).resolves.toBeUndefined();
      await expect(engine(t, { model: "other" }).checkServer()).rejects.toMatchObject({ code: "engine_model_missing" });
      // A request naming another model: 404 NotFoundError (serve/engine/serving.py _check_model).
      const wrong = await raw(t, "/v1/completions", rlqBody(t.prompt, { model: "other" }));
      expect({ status: wrong.status, body: wrong.json }, t.name).toEqual({
        status: 404,
        body: { error: { message: `The model \`other\` does not exist. Valid aliases: ${MODEL}.`, type: "NotFoundError", param: "model", code: 404 } },
      });
    }
  });

  it("weight_update_mode in_place: a server started without --enable-scale-out is refused at admission, naming the flag", async () => {
    // entrypoints/scale_out/factories.py: without the flag /inference/v1/generate answers 403 (the
    // in-place adapter reads each token's version there: src/engines/vllm-in-place.ts).
    const t = targets[0] as Target;
    expect((await raw(t, "/inference/v1/generate", {})).status).toBe(403);
    await expect(createVllmInPlaceEngine({ url: t.url, model: MODEL, requestTimeoutMs: 60_000, apiKey: KEY }).checkServer()).rejects.toMatchObject({
      code: "engine_cannot_load",
      message: expect.stringMatching(/in_place .*\/inference\/v1\/generate.*only when started with --enable-scale-out/),
    });
  });

  it("--api-key: /v1 answers 401 without it, /health and /metrics are open, rlq's calls carry it", async () => {
    for (const t of targets) {
      // serve/middleware/authenticate.py: GUARDED_PREFIX paths only; the scheme in any case.
      expect(await raw(t, "/v1/models", undefined, {}), t.name).toMatchObject({ status: 401, json: { error: "Unauthorized" } });
      expect((await raw(t, "/v1/models", undefined, { authorization: "Bearer wrong" })).status, t.name).toBe(401);
      expect((await raw(t, "/v1/models", undefined, { authorization: `bearer ${KEY}` })).status, t.name).toBe(200);
      expect(await raw(t, "/health", undefined, {}), t.name).toMatchObject({ status: 200, text: "" });
      expect((await raw(t, "/metrics", undefined, {})).status, t.name).toBe(200);

      const noKey = engine(t, { apiKey: null });
      expect(await noKey.health(), t.name).toBe(true);
      await expect(noKey.generate(request(`nokey-${t.name}`, { inputIds: t.prompt, stopTokenIds: [] })), t.name).rejects.toMatchObject({
        code: "engine_unauthorized",
        isRetriable: false,
        message: expect.stringMatching(/wants an API key .*engine\.api_key/),
      });
      expect((await engine(t).generate(request(`key-${t.name}`, { inputIds: t.prompt, stopTokenIds: [] }))).tokenIds.length).toBeGreaterThan(0);
    }
  });

  it("streamed generation: token ids and log-probs of equal length; stop at EOS, at a stop_token_ids entry, length at max_tokens", async () => {
    for (const t of targets) {
      const p = await poolOf(t);
      const atEos = await p.generate(request(`eos-${t.name}`, { inputIds: t.prompt, stopTokenIds: [], maxNewTokens: 200, seed: 3 }));
      expect(atEos.finishReason, t.name).toBe("stop");
      expect(atEos.tokenIds.at(-1), t.name).toBe(t.eosId);
      checkTokens(atEos);

      // The same seed again, told to stop at a token it generated: it stops there, that token kept.
      const at = atEos.tokenIds.findIndex((x, i) => i > 0 && x !== t.eosId && atEos.tokenIds.indexOf(x) === i);
      const stopId = atEos.tokenIds[at] as number;
      const atStop = await p.generate(request(`stop-${t.name}`, { inputIds: t.prompt, stopTokenIds: [stopId], maxNewTokens: 200, seed: 3 }));
      expect(atStop, t.name).toMatchObject({ finishReason: "stop", tokenIds: atEos.tokenIds.slice(0, at + 1) });
      checkTokens(atStop);
      // stop_reason: the stop token's id; null for EOS (v1/core/sched/utils.py check_stop).
      const stopped = await raw(t, "/v1/completions", rlqBody(t.prompt, { max_tokens: 200, seed: 3, stop_token_ids: [stopId] }));
      expect((stopped.json?.choices as Array<Record<string, unknown>>)[0], t.name).toMatchObject({ finish_reason: "stop", stop_reason: stopId });
      const eos = await raw(t, "/v1/completions", rlqBody(t.prompt, { max_tokens: 200, seed: 3 }));
      expect((eos.json?.choices as Array<Record<string, unknown>>)[0], t.name).toMatchObject({ finish_reason: "stop", stop_reason: null });

      const atLength = await p.generate(request(`len-${t.name}`, { inputIds: t.prompt, stopTokenIds: [], maxNewTokens: 2, seed: 3 }));
      expect(atLength, t.name).toMatchObject({ finishReason: "length", tokenIds: atEos.tokenIds.slice(0, 2) });
      checkTokens(atLength);
    }
  });

  it("the answers have the same fields, streamed and not", async () => {
    const seen: Record<string, unknown> = {};
    for (const t of targets) {
      const whole = await raw(t, "/v1/completions", rlqBody(t.prompt, { request_id: "shape", ignore_eos: true }));
      expect(whole.json?.id, t.name).toBe("cmpl-shape");
      const streamed = await raw(t, "/v1/completions", rlqBody(t.prompt, { stream: true, ignore_eos: true }));
      expect(streamed.contentType, t.name).toMatch(/^text\/event-stream/);
      const events = sseEvents(streamed.text);
      expect(events.length, t.name).toBe(6); // one event per token, the last with the finish reason
      const first = (events[0] as { choices: Array<Record<string, unknown>> }).choices[0];
      expect(Array.isArray(first?.prompt_token_ids), t.name).toBe(true);
      seen[t.name] = { whole: shape(whole.json), first: shape(events[0]), middle: shape(events[1]), last: shape(events.at(-1)) };
    }
    expect(seen.fake).toEqual(seen.vllm);
  });

  it("refusals: 400 with vLLM's error body, the same from the fake; rlq fails that request once, as the request's fault", async () => {
    const cases = {
      overLongPrompt: rlqBody(longPrompt(MAX_MODEL_LEN + 5)),
      maxTokensOverContext: rlqBody([1, 2, 3], { max_tokens: MAX_MODEL_LEN + 1 }),
      promptFillsContext: rlqBody(longPrompt(MAX_MODEL_LEN)),
      outOfVocabulary: rlqBody([1, 100_000]),
      topKBelowMinusOne: rlqBody([1, 2, 3], { top_k: -2 }),
      tooManyLogprobs: rlqBody([1, 2, 3], { logprobs: 21 }),
    };
    const answers: Record<string, unknown> = {};
    for (const t of targets) {
      const got: Record<string, unknown> = {};
      for (const [name, body] of Object.entries(cases)) {
        const r = await raw(t, "/v1/completions", body);
        got[name] = { status: r.status, body: r.json };
      }
      answers[t.name] = got;
    }
    expect(answers.vllm).toMatchObject({
      overLongPrompt: {
        status: 400,
        body: {
          error: {
            type: "BadRequestError",
            param: "input_tokens",
            code: 400,
            message: `This model's maximum context length is ${MAX_MODEL_LEN} tokens. However, your prompt contains ${MAX_MODEL_LEN + 5} input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=${MAX_MODEL_LEN + 5})`,
          },
        },
      },
      maxTokensOverContext: {
        status: 400,
        body: {
          error: {
            param: "max_tokens",
            message: expect.stringMatching(new RegExp(`^max_tokens=${MAX_MODEL_LEN + 1} cannot be greater than max_model_len=${MAX_MODEL_LEN}`)),
          },
        },
      },
      promptFillsContext: {
        status: 400,
        body: { error: { param: "max_tokens", message: "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)" } },
      },
      outOfVocabulary: { status: 400, body: { error: { param: null, message: "Token id 100000 is out of vocabulary" } } },
      topKBelowMinusOne: { status: 400, body: { error: { param: null } } },
      tooManyLogprobs: { status: 400, body: { error: { param: "logprobs" } } },
    });
    expect(answers.fake).toEqual(answers.vllm);

    // A prompt that fits with less room than max_tokens is not refused: vLLM generates what fits
    // (serve/utils/api_utils.py get_max_tokens) and finishes with "length".
    for (const t of targets) {
      const r = await raw(t, "/v1/completions", rlqBody(longPrompt(MAX_MODEL_LEN - 4), { max_tokens: 100, ignore_eos: true }));
      const choice = (r.json?.choices as Array<{ finish_reason: string; token_ids: number[] }>)[0];
      expect({ status: r.status, finish: choice?.finish_reason, n: choice?.token_ids.length }, t.name).toEqual({ status: 200, finish: "length", n: 4 });
    }

    // Through rlq: a 400 fails the sample's request once with vLLM's reason (an engine used without
    // admission, which has not read max_model_len); the engine stays healthy.
    for (const t of targets) {
      await expect(engine(t).generate(request(`long0-${t.name}`, { inputIds: longPrompt(MAX_MODEL_LEN + 5), stopTokenIds: [] })), t.name).rejects.toMatchObject(
        {
          code: "engine_request_rejected",
          isRetriable: false,
          message: expect.stringMatching(
            new RegExp(
              `HTTP 400: This model's maximum context length is ${MAX_MODEL_LEN} tokens\\. However, your prompt contains ${MAX_MODEL_LEN + 5} input tokens`,
            ),
          ),
        },
      );
      // Admitted (max_model_len read): refused before it is sent, naming the numbers.
      const p = await poolOf(t);
      await expect(p.generate(request(`long-${t.name}`, { inputIds: longPrompt(MAX_MODEL_LEN + 5), stopTokenIds: [] })), t.name).rejects.toMatchObject({
        code: "engine_request_rejected",
        isRetriable: false,
        message: expect.stringMatching(new RegExp(`the input is ${MAX_MODEL_LEN + 5} tokens .*max_model_len ${MAX_MODEL_LEN}`)),
      });
      const [snap] = p.snapshot().engines;
      expect(snap, t.name).toMatchObject({ state: "healthy", errors: 0, deaths: 0, requestErrors: 1 });
      expect((await p.generate(request(`after-${t.name}`, { inputIds: t.prompt, stopTokenIds: [] }))).finishReason, t.name).not.toBe("abort");
    }
  });

  it("the log-prob probe reads the default --logprobs-mode (raw_logprobs) as unscaled and before truncation", async () => {
    for (const t of targets) {
      const probe = await engine(t).probeLogProbs([1, 2, 3, 4, 5, 6, 7, 8]);
      expect(probe, `${t.name}: ${probe.detail}`).toMatchObject({ isTemperatureScaled: false, isBeforeTruncation: true });
      const p = await poolOf(t);
      await expect(p.generate(request(`t08-${t.name}`, { inputIds: t.prompt, temperature: 0.8, stopTokenIds: [] })), t.name).rejects.toMatchObject({
        code: "engine_logprobs_unscaled",
      });
      expect((await p.generate(request(`t1-${t.name}`, { inputIds: t.prompt, topP: 0.9, stopTokenIds: [] }))).tokenIds.length).toBeGreaterThan(0);
    }
  });

  // The pool's abort: by id through the dev routes on the real server (startVllm runs dev mode), by
  // closing the connection on the fake (the default server, which has no such route). Either way
  // the request ends on the server without finishing by itself.
  it("the pool aborts mid-stream: rlq keeps the streamed tokens, and the server stops running the request", async () => {
    for (const t of targets) {
      // The pool's engine, tapped so the test sees the request's partial output as it streams.
      let streaming: PartialOutput | null = null;
      // Tapped on the engine itself: a copy ({...e}) would lose the methods and getters of its class.
      const tapped: OpenAiCompatEngine = engine(t);
      const generateWith = tapped.generateWith.bind(tapped);
      tapped.generateWith = (req, hooks) => {
        streaming = hooks.partial;
        return generateWith(req, hooks);
      };
      const p = h.pool([tapped], { healthTimeoutMs: 10_000 });
      await p.awaitReady(60_000);
      const r = await cutMidStream(
        t,
        (id) => {
          streaming = null;
          const result = p.generate(request(id, { inputIds: longPrompt(16), stopTokenIds: [], maxNewTokens: MAX_MODEL_LEN - 16, seed: 1, ignoreEos: true }));
          return { result, tokens: () => streaming?.tokenIds.length ?? 0 };
        },
        (id) => p.abort([id]),
        MAX_MODEL_LEN - 16,
      );
      // What streamed before the cut is what rlq keeps.
      expect(r.tokenIds, t.name).toEqual((streaming as PartialOutput | null)?.tokenIds ?? []);
      checkTokens(r);
    }
  });

  it("dev mode (VLLM_SERVER_DEV_MODE=1): rlq's abort ends the request on the server by the id rlq set (POST /abort_requests)", async () => {
    // entrypoints/rl/online/api_router.py abort_requests, registered only in dev mode and outside
    // /v1, so --api-key does not guard it; the adapter finds it at admission (GET /is_paused). The
    // engine is called directly, its connection held open: only the abort by id can end the request.
    const t = targets.find((x) => x.name === "vllm") as Target;
    const e = engine(t);
    await e.checkServer();
    expect(e.canAbortById).toBe(true);
    await cutMidStream(
      t,
      (id) => {
        const partial = emptyPartial();
        const result = e.generateWith(request(id, { inputIds: longPrompt(16), stopTokenIds: [], maxNewTokens: MAX_MODEL_LEN - 16, seed: 1, ignoreEos: true }), {
          partial,
        });
        return { result, tokens: () => partial.tokenIds.length };
      },
      (id) => e.abort([id]),
      MAX_MODEL_LEN - 16,
    );
    // The default server (the fake stands for it) has neither route: the pool closes the connection instead.
    const fake = targets[1] as Target;
    expect((await raw(fake, "/abort_requests", { request_ids: ["x"] }, {})).status).toBe(404);
    const onFake = engine(fake);
    await onFake.checkServer();
    expect(onFake.canAbortById).toBe(false);
  });

  it("max_model_len is read at admission: max_tokens over what is left is clamped (vLLM refuses it past max_model_len), and an input that leaves no room fails its sample naming both numbers", async () => {
    for (const t of targets) {
      const p = await poolOf(t);
      // vLLM alone: max_tokens over max_model_len is a 400 even where the prompt leaves room.
      const refused = await raw(t, "/v1/completions", rlqBody(longPrompt(MAX_MODEL_LEN - 4), { max_tokens: MAX_MODEL_LEN + 1, ignore_eos: true }));
      expect(refused.status, t.name).toBe(400);
      // Through rlq: the budget is clamped to the 4 positions left; the sample is truncated, not failed.
      const clamped = await p.generate(
        request(`clamp-${t.name}`, { inputIds: longPrompt(MAX_MODEL_LEN - 4), stopTokenIds: [], maxNewTokens: MAX_MODEL_LEN + 1, ignoreEos: true }),
      );
      expect({ finish: clamped.finishReason, n: clamped.tokenIds.length }, t.name).toEqual({ finish: "length", n: 4 });
      await expect(p.generate(request(`full-${t.name}`, { inputIds: longPrompt(MAX_MODEL_LEN), stopTokenIds: [] })), t.name).rejects.toMatchObject({
        code: "engine_request_rejected",
        isRetriable: false,
        message: expect.stringMatching(new RegExp(`the input is ${MAX_MODEL_LEN} tokens .* max_model_len ${MAX_MODEL_LEN}, which leaves no room`)),
      });
      expect(p.snapshot().engines[0], t.name).toMatchObject({ state: "healthy", errors: 0, deaths: 0, requestErrors: 1 });
    }
  });

  it("finish_reason repetition (repetition_detection): a complete sample, stop with its reason, never retried or counted against the engine", async () => {
    const detection = { max_pattern_size: 3, min_count: 2 };
    for (const t of targets) {
      const e = createOpenAiCompatEngine({ url: t.url, model: MODEL, requestTimeoutMs: 60_000, apiKey: KEY, repetitionDetection: detection });
      const p = h.pool([e], { healthTimeoutMs: 10_000 });
      await p.awaitReady(60_000);
      let r: GenerateResult | null = null;
      let seed = 0;
      while (r?.stopReason === undefined && seed < 8) {
        seed++;
        r = await p.generate(request(`rep-${t.name}-${seed}`, { inputIds: t.prompt, stopTokenIds: [], maxNewTokens: 400, seed, ignoreEos: true }));
      }
      expect(r, `${t.name}: no seed repeated itself within 400 tokens`).toMatchObject({ finishReason: "stop", stopReason: "repetition" });
      const got = r as GenerateResult;
      checkTokens(got);
      expect(got.tokenIds.length, t.name).toBeLessThan(400);
      // The same request raw: vLLM's own reason (v1/core/sched/utils.py check_stop).
      const same = await raw(t, "/v1/completions", rlqBody(t.prompt, { max_tokens: 400, seed, ignore_eos: true, repetition_detection: detection }));
      expect((same.json?.choices as Array<Record<string, unknown>>)[0], t.name).toMatchObject({
        finish_reason: "repetition",
        stop_reason: "repetition_detected",
        token_ids: got.tokenIds,
      });
      expect(p.snapshot().engines[0], t.name).toMatchObject({ state: "healthy", errors: 0, requestErrors: 0 });
    }
  });

  it("--api-key guards /v1 only: rlq loads weights through the dev routes of a keyed server, and reads the version back", async () => {
    const t = targets.find((x) => x.name === "vllm") as Target;
    // serve/middleware/authenticate.py GUARDED_PREFIX (/v1, /v2, /inference, /cohere): the dev
    // routes answer without a key, /v1 does not.
    expect((await raw(t, "/weight_info", undefined, {})).status).toBe(200);
    expect((await raw(t, "/is_paused", undefined, {})).json).toEqual({ is_paused: false });
    expect((await raw(t, "/v1/models", undefined, {})).status).toBe(401);
    const model = await fixtureModel(python);
    const e = createOpenAiCompatEngine({ url: t.url, model: MODEL, requestTimeoutMs: 60_000, apiKey: KEY, loadsWeights: true });
    await e.checkServer();
    await e.loadWeights(7, `file://${model}`);
    expect(await e.weightVersion()).toBe(7);
    expect((await raw(t, "/weight_info", undefined, {})).json).toEqual({ weight_version: "7" });
    const after = await e.generate(request("after-load", { inputIds: t.prompt, stopTokenIds: [], seed: 3 }));
    expect(after.weightVersion).toBe(7);
  });

  it("trainer_push: a server started without a weight transfer backend refuses the push, and the trainer's error names the flag to add", async () => {
    // The dev route exists (entrypoints/rl/online/api_router.py), but the worker builds a transfer
    // engine only with --weight-transfer-config (v1/worker/gpu_worker.py load_model,
    // _check_weight_transfer_engine). This server has none; a push into one that has the gloo
    // backend is test_weight_push_vllm.py and vllm-faults.test.ts.
    const t = targets.find((x) => x.name === "vllm") as Target;
    const init = await raw(t, "/init_weight_transfer_engine", { init_info: { master_address: "127.0.0.1", master_port: 1, rank_offset: 1, world_size: 2 } });
    expect(init.status, init.text).toBeGreaterThanOrEqual(400);
    expect(init.text).toMatch(/Weight transfer not configured|Internal Server Error/);
    // The trainer's pusher (rlq_torch/weight_push.py VllmPusher, --push-via vllm-gloo) against it.
    const script = [
      "import sys, socket, torch",
      "sys.path.insert(0, 'workers/trainer-torch')",
      "from rlq_torch.weight_push import PushError, VllmPusher",
      "s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]; s.close()",
      `p = VllmPusher([${JSON.stringify(t.url)}], backend='gloo', master_address='127.0.0.1', master_port=port, api_key=${JSON.stringify(KEY)}, timeout_s=60)`,
      "try:",
      "    p.push([('w', torch.ones(2))], 1)",
      "except PushError as e:",
      "    print(e)",
    ].join("\n");
    const r = await runCommand(python, ["-c", script], { cwd: repoRoot, timeoutMs: 120_000 });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toMatch(
      /\/init_weight_transfer_engine: HTTP 5\d\d.*the engine did not open its weight transfer.*--weight-transfer-config '\{"backend": "gloo"\}'/,
    );
    expect(r.stdout).toMatch(/python -m rlq_torch\.vllm_serve/);
    // The server goes on serving, at the version it had: an adapter of a trainer_push run reads it from /weight_info.
    expect((await engine(t).generate(request("after-init", { inputIds: t.prompt, stopTokenIds: [], seed: 3 }))).tokenIds.length).toBeGreaterThan(0);
    const pushed = createOpenAiCompatEngine({ url: t.url, model: MODEL, requestTimeoutMs: 60_000, apiKey: KEY, isPushed: true });
    await pushed.checkServer();
    const info = (await raw(t, "/weight_info", undefined, {})).json as { weight_version: string };
    expect(await pushed.weightVersion()).toBe(info.weight_version === "default" ? 0 : Number(info.weight_version));
  });
});
