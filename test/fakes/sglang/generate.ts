/**
 * The fake SGLang's /generate, single and batch, streamed and not (test/fakes/fake-sglang.ts
 * documents each behaviour and the SGLang source it comes from).
 */
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import type { ServerResponse } from "node:http";
import { EOS, inputTokenLogProb, instantToken, sampleToken } from "../fake-lm.ts";
import {
  hangWhileFaulted,
  isHanging,
  isMemoryReleased,
  live,
  opts,
  reportedVersion,
  send,
  sleep,
  st,
  stats,
  take5xx,
  type Finish,
  type Generated,
  type LiveRequest,
} from "./state.ts";

/**
 * One request's images, as SGLang reads `image_data` (python/sglang/srt/managers/io_struct.py
 * GenerateReqInput: one image, or a list of them for a single request; a list with one entry per
 * item for a batch), each loaded as SGLang's load_image does (python/sglang/srt/utils/common.py;
 * python/sglang/srt/utils.py before the utils package): a name ending in png, jpg, jpeg, webp or gif is a file,
 * a `data:` URI is decoded after its comma, anything else is base64
 * (URLs are not fetched here). Returns the
 * sha256 of each image's bytes, or the reason it cannot be loaded (SGLang fails the request).
 */
export function imagesOf(value: unknown): { hashes: string[] } | { error: string } {
  if (value === undefined || value === null) return { hashes: [] };
  const list = Array.isArray(value) ? value : [value];
  const hashes: string[] = [];
  for (const [i, x] of list.entries()) {
    if (typeof x !== "string" || x === "") return { error: `image_data[${i}]: expected a path or base64 string` };
    let bytes: Buffer;
    if (/(png|jpg|jpeg|webp|gif)$/i.test(x)) {
      try {
        bytes = readFileSync(x);
      } catch (e) {
        return { error: `image_data[${i}]: ${(e as Error).message}` };
      }
    } else if (x.startsWith("data:")) {
      const comma = x.indexOf(",");
      if (comma === -1) return { error: `image_data[${i}]: a data URI without a comma` };
      bytes = Buffer.from(x.slice(comma + 1), "base64");
    } else {
      bytes = Buffer.from(x, "base64");
    }
    if (bytes.length === 0) return { error: `image_data[${i}]: empty image` };
    hashes.push(createHash("sha256").update(bytes).digest("hex"));
  }
  return { hashes };
}

/** One request's image_data entries as a list (a single image may come bare); imagesOf has checked them. */
function imageList(value: unknown): string[] {
  if (value === undefined || value === null) return [];
  return (Array.isArray(value) ? value : [value]).filter((x): x is string => typeof x === "string");
}

/**
 * The fake's answer depends on the images: their hashes are folded into the sampling seed, so
 * another image (or none) gives other tokens, and a test sees that the bytes arrived.
 */
function withImages(sp: Record<string, unknown>, hashes: readonly string[]): Record<string, unknown> {
  if (hashes.length === 0) return sp;
  const h = createHash("sha256").update(hashes.join(",")).digest().readUInt32BE(0) & 0x7fffffff;
  return { ...sp, sampling_seed: (Number(sp.sampling_seed ?? 0) ^ h) >>> 0 };
}

/** Why SGLang would refuse this request before generating (tokenizer_manager.py _validate_one_request), or null. */
export function refusal(ids: unknown, sp: Record<string, unknown>, rid: string): string | null {
  if (!Array.isArray(ids) || ids.length === 0) return "input_ids required";
  if (ids.length >= opts.contextLength) return `The input (${ids.length} tokens) is longer than the model's context length (${opts.contextLength} tokens).`;
  const maxNew = sp.max_new_tokens;
  if (typeof maxNew === "number" && maxNew + ids.length >= opts.contextLength) {
    return (
      `Requested token count exceeds the model's maximum context length of ${opts.contextLength} tokens. ` +
      `You requested a total of ${maxNew + ids.length} tokens: ${ids.length} tokens from the input messages and ${maxNew} tokens for the completion. ` +
      `Please reduce the number of tokens in the input messages or the completion to fit within the limit.`
    );
  }
  if (sp.top_k === 0) return "top_k must be -1 (disable), or at least 1, got 0.";
  if (
    sp.sampling_seed !== undefined &&
    (!Number.isInteger(sp.sampling_seed) || (sp.sampling_seed as number) > 0x7fffffff || (sp.sampling_seed as number) < 0)
  ) {
    return `sampling_seed ${JSON.stringify(sp.sampling_seed)} does not fit the int32 seed tensor`;
  }
  if (live.has(rid)) {
    stats.duplicates++;
    return `Duplicate request ID detected: ${rid}`;
  }
  return null;
}

/** One request's (or one batch item's) generation; `onToken` sees the tokens as they come (streaming). */
export async function generateOne(
  ids: number[],
  sp: Record<string, unknown>,
  topN: number,
  rid: string,
  state: LiveRequest,
  onToken: ((g: Generated) => void) | null,
): Promise<Generated> {
  const maxNew = Number(sp.max_new_tokens ?? 128);
  const seed = Number(sp.sampling_seed ?? 0);
  if (sp.sampling_seed !== undefined) stats.seedsSeen.push(seed);
  const temperature = Number(sp.temperature ?? 1);
  const topP = Number(sp.top_p ?? 1);
  const topK = Number(sp.top_k ?? -1);
  const ignoreEos = sp.ignore_eos === true;
  const stopIds = new Set((sp.stop_token_ids as number[] | undefined) ?? []);
  if (!ignoreEos) stopIds.add(EOS);
  // layers/sampler.py: greedy path when every request has top_k <= 1 (top_k -1 means "all" and is turned
  // into the vocabulary size, temperature 0 into top_k 1: sampling/sampling_params.py).
  const isGreedyPath = topK === 1 || temperature < 1e-5;
  stats.maxLive = Math.max(stats.maxLive, live.size);
  stats.generate++;
  stats.firstGenerateAt[String(st.weightVersion)] ??= Date.now();
  const g: Generated = { out: [], top: [], versions: [], finish: "length" };
  let prev = ids[ids.length - 1] ?? 0;
  try {
    const drawn = opts.policyUrl
      ? await policyDraw(ids, sp, state.imageData ?? [], opts.isDeterministic ? seed : Math.floor(Math.random() * 0x7fffffff))
      : null;
    for (let i = 0; i < maxNew; i++) {
      if (drawn && i >= drawn.output_ids.length) {
        g.finish = drawn.finish;
        break;
      }
      if (opts.tokenDelayMs > 0) await sleep(opts.tokenDelayMs);
      if (isHanging() && g.out.length >= st.fault.afterTokens) await hangWhileFaulted();
      while (st.paused && !state.aborted) await st.paused;
      if (st.fault.mode === "error_abort" && g.out.length >= st.fault.afterTokens) {
        g.finish = "error_abort";
        break;
      }
      if (st.fault.mode === "error_event" && g.out.length >= st.fault.afterTokens && st.fault.count !== 0) {
        if (st.fault.count > 0) st.fault.count--;
        g.finish = "error_event";
        break;
      }
      if (state.aborted || (st.fault.mode === "abort_mid" && g.out.length >= st.fault.afterTokens)) {
        g.finish = "abort";
        break;
      }
      const version = st.weightVersion;
      const x = {
        seed,
        version,
        position: ids.length + i,
        prev,
        temperature,
        topP,
        topK,
        stopProb: opts.stopProb,
        isEosAllowed: i > 0 && !ignoreEos,
        mode: isGreedyPath && opts.logprobMode === "scaled" ? ("original" as const) : opts.logprobMode,
        topN,
        ...(opts.isDeterministic ? {} : { unseeded: Math.random() }),
      };
      const d = drawn
        ? { token: drawn.output_ids[i] as number, logProb: drawn.output_logprobs[i] as number, top: [] as Array<[number, number]> }
        : opts.isInstant
          ? { ...instantToken(x), top: [] as Array<[number, number]> }
          : sampleToken(x);
      g.out.push([d.logProb, d.token, null]);
      stats.tokensGenerated++;
      if (topN > 0) g.top.push(d.top.map(([lp, t]) => [lp, t, null]));
      g.versions.push(version);
      prev = d.token;
      if (st.fault.mode === "die" && g.out.length >= st.fault.afterTokens) {
        process.stderr.write(`fake-sglang: injected death after ${g.out.length} tokens of ${rid}\n`);
        process.exit(1);
      }
      if (!drawn && stopIds.has(d.token)) {
        g.finish = "stop";
        break;
      }
      if (onToken && i + 1 < maxNew) onToken(g);
    }
  } finally {
    g.endVersion = reportedVersion();
    live.delete(rid);
    if (live.size === 0 && st.drained) st.drained();
  }
  if (g.finish === "abort" || g.finish === "error_abort") stats.aborted++;
  return g;
}

/** The policy's answer (test/fakes/hf-vlm-policy.py): the whole response, drawn as SGLang's scheduler draws it. */
interface PolicyDraw {
  output_ids: number[];
  output_logprobs: number[];
  finish: "stop" | "length";
}

async function policyDraw(ids: number[], sp: Record<string, unknown>, imageData: readonly string[], seed: number): Promise<PolicyDraw> {
  const res = await fetch(`${opts.policyUrl}/generate`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ input_ids: ids, image_data: imageData, sampling_params: sp, seed }),
  });
  const body = (await res.json()) as PolicyDraw & { error?: string };
  if (res.status !== 200) throw new Error(`policy /generate: ${res.status} ${body.error ?? ""}`);
  return body;
}

export const errorAbortMessage = () => `injected server-side error ${st.fault.statusCode}`;

export function finishReason(f: Finish | null) {
  if (f === null) return null;
  if (f === "abort") return { type: "abort", message: "Abort before finishing." };
  if (f === "error_abort") return { type: "abort", message: errorAbortMessage(), status_code: st.fault.statusCode };
  return { type: f };
}

/**
 * What tokenizer_manager.py _wait_one_response makes of a finished request whose finish_reason is
 * an abort with status_code: 400 raises ValueError (a request error), 500 and 503 raise
 * fastapi.HTTPException; other codes are passed on in finish_reason.
 */
export function raisedBy(g: Generated): Raised | null {
  if (g.finish === "error_event") {
    return { kind: "error_event", status: st.fault.statusCode, message: `injected error ${st.fault.statusCode}`, isRetryable: st.fault.isRetryable };
  }
  if (g.finish !== "error_abort") return null;
  if (st.fault.statusCode === 400) return { kind: "value_error", status: 400, message: errorAbortMessage() };
  if (st.fault.statusCode === 500 || st.fault.statusCode === 503) return { kind: "http_exception", status: st.fault.statusCode, message: errorAbortMessage() };
  return null;
}

/**
 * An exception raised for one request: a ValueError, an HTTPException, or (error_event, the fault
 * that cues it) one carrying its own status and whether a retry may pass.
 */
export interface Raised {
  kind: "value_error" | "http_exception" | "error_event";
  status: number;
  message: string;
  isRetryable?: boolean;
}

/**
 * The `error` member of an event: newest http_server.py generate_request's stream_results sends
 * {message, type, code: <HTTP status>, retryable} (python/sglang/srt/entrypoints/http_server.py);
 * 0.5.x (--api-layout 0.5) sends {message} only.
 */
export function errorMember(message: string, status = 400, isRetryable = false): Record<string, unknown> {
  if (opts.isOldLayout) return { message };
  return { message, type: status < 500 ? "invalid_request_error" : "internal_error", code: status, retryable: isRetryable };
}

/** http_server.py: a ValueError is _create_error_response (400 {"error": {"message"}}); an HTTPException goes through validation_exception_handler. */
export function sendRaised(res: ServerResponse, r: Raised): void {
  if (r.kind === "error_event") return send(res, r.status, { error: errorMember(r.message, r.status, r.isRetryable) });
  if (r.kind === "value_error") return send(res, 400, { error: { message: r.message } });
  send(res, r.status, { object: "error", message: r.message, type: String(r.status), param: null, code: r.status });
}

/** utils/weight_versions.py compute_weight_version_spans / add_weight_versions_to_meta_info: [{version, start, end}]. */
export function spansOf(versions: number[]): Array<{ version: string; start: number; end: number }> {
  const spans: Array<{ version: string; start: number; end: number }> = [];
  versions.forEach((raw, i) => {
    const v = String(st.fault.mode === "stale_version" ? st.fault.version : raw);
    const last = spans[spans.length - 1];
    if (last && last.version === v) last.end = i + 1;
    else spans.push({ version: v, start: i, end: i + 1 });
  });
  return spans.length > 0 ? spans : [{ version: String(reportedVersion()), start: 0, end: 0 }];
}

/** meta_info for tokens [from, g.out.length): from 0 (cumulative) or from the last event (incremental). */
export function metaInfo(rid: string, promptTokens: number, g: Generated, finish: Finish | null, from = 0) {
  if (finish === "abort" && g.out.length === 0) {
    // tokenizer_manager.py _handle_abort_req: the scheduler dropped it from the waiting queue.
    return { id: rid, finish_reason: { type: "abort", message: "Abort before prefill" }, prompt_tokens: 0, completion_tokens: 0 };
  }
  // The Rust frontend's frame (generate.proto GenerateMetaInfo at 09d9c399) has no weight_version,
  // weight_versions or cached_tokens.
  if (opts.isRustFrontend)
    return {
      id: rid,
      output_token_logprobs: from === 0 ? g.out : g.out.slice(from),
      ...(g.top.length > 0 ? { output_top_logprobs: from === 0 ? g.top : g.top.slice(from) } : {}),
      finish_reason: finishReason(finish),
      prompt_tokens: promptTokens,
      completion_tokens: g.out.length,
    };
  const spans = opts.hasSpans ? spansOf(g.versions) : null;
  return {
    id: rid,
    output_token_logprobs: from === 0 ? g.out : g.out.slice(from),
    ...(g.top.length > 0 ? { output_top_logprobs: from === 0 ? g.top : g.top.slice(from) } : {}),
    finish_reason: finishReason(finish),
    weight_version:
      spans !== null
        ? (spans[spans.length - 1] as { version: string }).version
        : String(finish !== null && g.endVersion !== undefined ? g.endVersion : reportedVersion()),
    ...(spans !== null ? { weight_versions: spans } : {}),
    prompt_tokens: promptTokens,
    completion_tokens: g.out.length,
    cached_tokens: 0,
  };
}

/** Marks the request gone when its client disconnects, but (like SGLang) aborts it only after a delay. */
export function watchDisconnect(res: ServerResponse, states: LiveRequest[]): () => boolean {
  let isGone = false;
  res.on("close", () => {
    if (res.writableFinished) return;
    isGone = true;
    setTimeout(() => {
      for (const s of states) s.aborted = true;
    }, opts.disconnectAbortDelayMs).unref();
  });
  return () => isGone;
}

export async function waitForTurn(): Promise<void> {
  while (st.loading) await st.loading;
  while (st.paused) await st.paused;
}

export async function generateBatch(b: Record<string, unknown>, res: ServerResponse): Promise<void> {
  const ids = b.input_ids as unknown[];
  const rids = b.rid;
  const sps = b.sampling_params;
  if (b.stream === true) return send(res, 400, { error: { message: "the fake answers batch requests only without streaming" } });
  if (!Array.isArray(rids) || rids.length !== ids.length || (Array.isArray(sps) && sps.length !== ids.length)) {
    return send(res, 400, { error: { message: "rid (and a sampling_params list) must have one entry per input" } });
  }
  if (b.return_logprob !== true) return send(res, 400, { error: { message: "rlq always asks for return_logprob" } });
  if (take5xx("generate")) return send(res, 503, { error: { message: "injected 5xx" } });
  await waitForTurn();
  if (isHanging() && st.fault.afterTokens <= 0) await hangWhileFaulted();
  const spOf = (i: number) => ((Array.isArray(sps) ? sps[i] : sps) ?? {}) as Record<string, unknown>;
  // tokenizer_manager.py validates every item before any is scheduled: one bad item fails the batch.
  for (let i = 0; i < ids.length; i++) {
    const why = refusal(ids[i], spOf(i), String(rids[i]));
    if (why !== null) {
      stats.refused++;
      return send(res, 400, { error: { message: why } });
    }
  }
  const imageData = b.image_data;
  if (imageData !== undefined && imageData !== null && (!Array.isArray(imageData) || imageData.length !== ids.length))
    return send(res, 400, { error: { message: "image_data must have one entry per input in a batch" } });
  const images: string[][] = [];
  for (let i = 0; i < ids.length; i++) {
    const got = imagesOf(Array.isArray(imageData) ? imageData[i] : undefined);
    if ("error" in got) return send(res, 400, { error: { message: got.error } });
    images.push(got.hashes);
    if (got.hashes.length > 0) stats.imagesSeen[String(rids[i])] = got.hashes;
  }
  stats.batches++;
  const states = ids.map((_, i) => {
    const s: LiveRequest = { aborted: false, imageData: imageList(Array.isArray(imageData) ? imageData[i] : undefined) };
    live.set(String(rids[i]), s);
    return s;
  });
  const isGone = watchDisconnect(res, states);
  const topN = Number(b.top_logprobs_num ?? 0);
  const gens = await Promise.all(
    ids.map((x, i) => generateOne(x as number[], withImages(spOf(i), images[i] ?? []), topN, String(rids[i]), states[i] as LiveRequest, null)),
  );
  if (isGone()) return;
  // tokenizer_manager.py _handle_batch_request: asyncio.gather of the items, so one raising item fails the batch.
  const raised = gens.map(raisedBy).find((r) => r !== null);
  if (raised) return sendRaised(res, raised);
  send(
    res,
    200,
    gens.map((g, i) => ({ text: "", meta_info: metaInfo(String(rids[i]), (ids[i] as number[]).length, g, g.finish) })),
  );
}

export async function generate(b: Record<string, unknown>, res: ServerResponse): Promise<void> {
  if (isMemoryReleased()) {
    // rlq must send no request while the engines are released; the fake counts and refuses any.
    stats.generateWhileReleased++;
    stats.generateWhileReleasedRids.push(JSON.stringify(b.rid ?? null));
    return send(res, 500, { error: { message: "memory released (release_memory_occupation): no weights or KV cache to generate with" } });
  }
  const ids = b.input_ids as number[];
  if (Array.isArray(ids) && Array.isArray(ids[0])) return generateBatch(b, res);
  const imgs = imagesOf(b.image_data);
  if ("error" in imgs) return send(res, 400, { error: { message: imgs.error } });
  const sp = withImages((b.sampling_params ?? {}) as Record<string, unknown>, imgs.hashes);
  if (imgs.hashes.length > 0 && typeof b.rid === "string") stats.imagesSeen[b.rid] = imgs.hashes;
  if (b.return_logprob !== true) return send(res, 400, { error: { message: "rlq always asks for return_logprob" } });
  if (take5xx("generate")) return send(res, 503, { error: { message: "injected 5xx" } });
  await waitForTurn();
  if (isHanging() && st.fault.afterTokens <= 0) await hangWhileFaulted();
  const isStream = b.stream === true;
  const rid = typeof b.rid === "string" ? b.rid : String(Math.random());
  const why = refusal(ids, sp, rid);
  if (why !== null) {
    stats.refused++;
    if (!isStream) return send(res, 400, { error: { message: why } });
    // http_server.py stream_results: the error becomes an event of a 200 response.
    res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
    const ev = `data: ${JSON.stringify({ error: errorMember(why) })}\n\n`;
    stats.bytesSent += ev.length + 14;
    res.write(ev);
    res.end("data: [DONE]\n\n");
    return;
  }
  const state: LiveRequest = { aborted: false, imageData: imageList(b.image_data) };
  live.set(rid, state);
  if (st.fault.mode === "reset" && st.fault.count !== 0) {
    if (st.fault.count > 0) st.fault.count--;
    // The connection dies mid-answer (a proxy, a network blip); the server keeps the request until its delayed abort.
    watchDisconnect(res, [state]);
    res.writeHead(200, { "content-type": b.stream === true ? "text/event-stream" : "application/json" });
    res.flushHeaders();
    setTimeout(() => res.socket?.destroy(), 20);
    await generateOne(ids, sp, 0, rid, state, null);
    return;
  }
  const isGone = watchDisconnect(res, [state]);
  const topN = Number(b.top_logprobs_num ?? 0);
  if (isStream) res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
  let sent = 0;
  const write = (g: Generated, finish: Finish | null) => {
    // --incremental-streaming-output: only the new tokens; the final abort event stays cumulative.
    const from = opts.isIncremental && !(finish === "abort" || finish === "error_abort") ? sent : 0;
    const ev = `data: ${JSON.stringify({ text: "", meta_info: metaInfo(rid, ids.length, g, finish, from) })}\n\n`;
    stats.bytesSent += ev.length;
    res.write(ev);
    sent = g.out.length;
  };
  const onToken = isStream
    ? (g: Generated) => {
        if (!isGone() && g.out.length % opts.streamInterval === 0) write(g, null);
      }
    : null;
  const g = await generateOne(ids, sp, topN, rid, state, onToken);
  if (isGone()) return;
  const raised = raisedBy(g);
  if (isStream) {
    if (raised?.kind === "http_exception") {
      // The HTTPException escapes stream_results (it catches ValueError only) after the 200 went out.
      res.destroy();
      return;
    }
    if (raised) {
      const ev = `data: ${JSON.stringify({ error: raised.kind === "error_event" ? errorMember(raised.message, raised.status, raised.isRetryable) : errorMember(raised.message) })}\n\n`;
      stats.bytesSent += ev.length;
      res.write(ev);
    } else write(g, g.finish);
    res.end("data: [DONE]\n\n");
  } else if (raised) {
    sendRaised(res, raised);
  } else {
    send(res, 200, { text: "", meta_info: { ...metaInfo(rid, ids.length, g, g.finish), ...inputLogprobs(b, ids) } });
  }
}

/**
 * return_logprob with logprob_start_len: the log-prob of each input token from position
 * logprob_start_len on, [[logprob, id, null]...], computed from the logits at the position before
 * (the prefill; a prompt-only request with max_new_tokens 0 is how slime's OPD teacher is asked,
 * slime/rollout/on_policy_distillation.py). The token at position 0 has no logits before it: its
 * log-prob is null (managers/scheduler_output_processor_mixin.py _process_input_token_logprobs
 * (via add_input_logprob_return_values) pads the first input position with None; slime drops it with `[1:]`). Without
 * logprob_start_len (-1, the default) no input log-probs are returned (io_struct.py GenerateReqInput).
 */
function inputLogprobs(b: Record<string, unknown>, ids: number[]): { input_token_logprobs?: Array<[number | null, number, null]> } {
  const start = typeof b.logprob_start_len === "number" ? b.logprob_start_len : -1;
  if (start < 0) return {};
  const out: Array<[number | null, number, null]> = [];
  for (let p = start; p < ids.length; p++) {
    const token = ids[p] as number;
    const lp = p === 0 ? null : inputTokenLogProb({ version: st.weightVersion, position: p, prev: ids[p - 1] as number, token, stopProb: opts.stopProb });
    out.push([lp, token, null]);
  }
  return { input_token_logprobs: out };
}
