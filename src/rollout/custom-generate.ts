/**
 * `custom_generate_function_path`: one sample, possibly multi-turn (slime's
 * custom generate function, e.g. a tool-using agent).
 *
 * The function is called once per rollout round of a sample:
 *
 * ```js
 * export async function generate(args, sample, { generate, tool, remainingTokens, tokenizer }) {
 *   const turns = [];
 *   for (;;) {
 *     const t = await generate(turns);            // one engine call on prompt + response so far + turns
 *     turns.push(t);
 *     if (t.finishReason !== "stop" || !wantsTool(t.text)) break;
 *     turns.push(tool("=12"));                    // environment tokens: loss mask 0
 *   }
 *   return { turns };                             // optionally status: "completed" | "truncated" | "failed"
 * }
 * ```
 *
 * `generate(turns)` is bound to the engine, to the sample's request ids
 * (`requestIdFor(segmentIndex)`, so the rollout job can abort them), seeds and
 * sampling params; its budget is what is left of `rollout_max_response_len`
 * after the response so far and `turns`. The function returns the turns it
 * appended. rlq validates them (zod, `customGenerateResultSchema`, then
 * `checkTurns`): engine turns are exactly the ones `generate` issued, in
 * order, unchanged (their log-probs are the engine's, never the plugin's);
 * tool turns carry loss mask 0 and log-prob 0; the total fits the budget.
 *
 * **One segment, one version.** Each engine call becomes one segment with the
 * weight version that generated it. Tool tokens are attached to the segment
 * of the engine call before them, with loss mask 0 and log-prob 0 (and
 * token version -1 in `assembleSample`, which keys versions on the mask). Tool
 * tokens before the first engine call of a round prefix that call's segment; a
 * round with tool tokens only is one segment at the job's version. Why not a
 * segment of its own with version -1: a segment's version is "who generated
 * these tokens", `weight_versions` would list -1, and staleness views would
 * count it.
 *
 * **Image observations.** `tool(text, { images })` loads each image as the
 * dataset loader does and checks that the turn holds the chat template's image
 * placeholder once per image. The images ride on the tool turn, then on the
 * segment the turn joins (`SegmentDraft.images`, stored in
 * `sample_segments.images`): every later engine call sends the prompt's images,
 * then earlier observations', then this round's, matching the placeholders'
 * order in its input ids, which the engine's processor pairs one by one.
 */

import { z } from "zod";
import type { Engine, FinishReason, SamplingParams } from "../engines/engine.ts";
import type { ImageRef, SampleStatus, SegmentFact } from "../core/sample.ts";
import { RlqError } from "../lib/errors.ts";
import { imageDataUri, loadImage, type ImageLoadOptions } from "../data/images.ts";

/** What the function sees of the sample (plain JSON, also what an HTTP plugin is sent). */
export interface CustomGenerateSample {
  sampleIndex: number;
  groupId: number;
  round: number;
  prompt: string;
  promptTokens: number[];
  /** Response so far (earlier rounds: a partial rollout resumes from here). */
  responseTokens: number[];
  response: string;
  label: string | null;
  metadata: Record<string, unknown>;
  status: SampleStatus;
  /** sha256 of every image the engine is sent before this round's turns (the prompt's, then earlier observations'); absent: none. */
  imageHashes?: string[];
}

export const engineTurnSchema = z.strictObject({
  kind: z.literal("engine"),
  requestId: z.string().min(1),
  tokens: z.array(z.number().int().nonnegative()),
  logProbs: z.array(z.number().finite().max(0)),
  weightVersion: z.number().int().nonnegative(),
  finishReason: z.enum(["stop", "length", "abort"]),
  engineId: z.string(),
  text: z.string(),
});
export type EngineTurn = z.infer<typeof engineTurnSchema>;

/** An image by reference (core/sample.ts `ImageRef`), as `tool(text, { images })` builds it. */
export const imageRefSchema = z.strictObject({
  type: z.string().min(1),
  key: z.string(),
  sha256: z.string().regex(/^[0-9a-f]{64}$/),
  byteLength: z.number().int().positive(),
  mime: z.string().startsWith("image/"),
  origin: z.enum(["path", "data_uri", "bytes"]),
  path: z.string().min(1),
  source: z.string().nullable(),
});

export const toolTurnSchema = z
  .strictObject({
    kind: z.literal("tool"),
    tokens: z.array(z.number().int().nonnegative()),
    text: z.string().optional(),
    /** Observation images, in the order of their placeholders in `tokens` (build them with `tool(text, { images })`). */
    images: z.array(imageRefSchema).optional(),
    /** Optional; if given, all 0: tool tokens are never trained on. */
    lossMask: z.array(z.literal(0)).optional(),
    /** Optional; if given, all 0. */
    logProbs: z.array(z.literal(0)).optional(),
  })
  .refine((t) => t.lossMask === undefined || t.lossMask.length === t.tokens.length, { message: "lossMask must have one 0 per token", path: ["lossMask"] })
  .refine((t) => t.logProbs === undefined || t.logProbs.length === t.tokens.length, { message: "logProbs must have one 0 per token", path: ["logProbs"] });
export type ToolTurn = z.infer<typeof toolTurnSchema>;

export const turnSchema = z.union([
  engineTurnSchema.refine((t) => t.tokens.length === t.logProbs.length, { message: "engine tokens and logProbs differ in length" }),
  toolTurnSchema,
]);
export type Turn = EngineTurn | ToolTurn;

export const customGenerateResultSchema = z.strictObject({
  turns: z.array(turnSchema),
  /** Default: from the last engine call's finish reason (stop → completed, length → truncated). */
  status: z.enum(["completed", "truncated", "failed"]).optional(),
});
export type CustomGenerateResult = z.infer<typeof customGenerateResultSchema>;

export interface GenerateOptions {
  /** At most this many new tokens (never more than the remaining budget). */
  maxNewTokens?: number;
  /** Stop ids added to the run's for this call (e.g. a tool-call terminator such as `)`). */
  extraStopTokenIds?: number[];
  temperature?: number;
}

/** One image as the dataset loader takes it: a path, a `data:image/...;base64,` URI, bytes, or `{bytes, path}`. */
export type ImageInput = string | Uint8Array | { bytes?: Uint8Array | null; path?: string | null };

export interface ToolOptions {
  /**
   * Images of the observation, in order. With text: each is one image placeholder of the chat
   * template (`imagePlaceholder`); text without placeholders gets one per image in front of it.
   * With token ids: the ids must hold the placeholder's ids once per image.
   */
  images?: readonly ImageInput[];
}

export interface CustomGenerateHelpers {
  /** One engine call on prompt + response so far + `turns`. Push the result into your turns. */
  generate(turns: readonly Turn[], options?: GenerateOptions): Promise<EngineTurn>;
  /** A tool/environment turn (loss mask 0) from text, encoded by the run's tokenizer, or from ids. */
  tool(textOrTokens: string | readonly number[], options?: ToolOptions): ToolTurn;
  /** The chat template's text for one image (Qwen2-VL `<|vision_start|><|image_pad|><|vision_end|>`); null: the run has none. */
  imagePlaceholder: string | null;
  /** The images every engine call sends before this round's own (the prompt's, then earlier observations'), as `sample.imageHashes` names them. */
  images: readonly ImageRef[];
  /** Tokens the response may still take after `turns`. */
  remainingTokens(turns: readonly Turn[]): number;
  tokenizer: { encode(text: string): number[]; decode(ids: readonly number[]): string };
}

export type CustomGenerateFunction = (args: unknown, sample: CustomGenerateSample, helpers: CustomGenerateHelpers) => unknown;

/** Everything `runCustomGenerate` needs from the rollout job (see docs/plugins.md for the wiring). */
export interface CustomGenerateBinding {
  engine: Engine;
  /** The run config as plugins get it (slime's `args`). */
  args: unknown;
  sample: CustomGenerateSample;
  /** Sampling params of the run, without the per-call budget and seed. */
  sampling: Omit<SamplingParams, "maxNewTokens" | "seed">;
  /** Tokens the response may still take at the start of the round. */
  budget: number;
  /** The segment index the round's first segment gets (the sample's segment count so far). */
  firstSegmentIndex: number;
  requestIdFor(segmentIndex: number): string;
  seedFor(segmentIndex: number): number;
  sessionKey?: string;
  /** Version recorded for a round that made no engine call (tool tokens only). */
  fallbackWeightVersion: number;
  /** Must add no special tokens (no BOS): tool text is spliced into the middle of a response. */
  tokenizer: { encode(text: string): number[]; decode(ids: readonly number[]): string };
  /** Request ids in flight, for the job's abort watcher. */
  inflight?: Set<string>;
  isAborted?: () => boolean;
  /** How the plugin was named, for messages. */
  where?: string;
  /** Images every engine call sends before the round's own (the prompt's, then earlier observations'), in placeholder order. */
  images?: readonly ImageRef[];
  /** Observation images: the chat template's placeholder text (absent or null: tool turns may carry no image). */
  imagePlaceholder?: string | null;
  /** Where relative image paths are read and inline images are kept (RLQ_HOME/images). */
  imageLoad?: ImageLoadOptions;
}

/** One segment to write (the rollout job adds sampleIndex, round, tokenStart, error). */
export type SegmentDraft = Omit<SegmentFact, "sampleIndex" | "round">;

export interface CustomGenerateOutcome {
  segments: SegmentDraft[];
  status: SampleStatus;
  /** Tokens appended this round (sum of segment lengths). */
  appendedTokens: number;
}

function turnsLength(turns: readonly Turn[]): number {
  return turns.reduce((n, t) => n + t.tokens.length, 0);
}

function invalid(where: string, message: string, cause?: unknown): RlqError {
  return new RlqError("custom_generate_invalid", `${where}: ${message}`, cause === undefined ? {} : { cause });
}

/** Run the user's function for one sample's round and turn its turns into segments. */
export async function runCustomGenerate(fn: CustomGenerateFunction, b: CustomGenerateBinding): Promise<CustomGenerateOutcome> {
  const where = `${b.where ?? "custom_generate_function_path"} (sample ${b.sample.sampleIndex})`;
  const issued: EngineTurn[] = [];
  const promptAndResponse = [...b.sample.promptTokens, ...b.sample.responseTokens];
  let isStopped = false; // after an abort no more engine calls: the round ends here
  const remainingTokens = (turns: readonly Turn[]) => b.budget - turnsLength(turns);

  const helpers: CustomGenerateHelpers = {
    tokenizer: b.tokenizer,
    remainingTokens,
    imagePlaceholder: b.imagePlaceholder ?? null,
    images: b.images ?? [],
    tool: (textOrTokens, options = {}) => toolTurn(textOrTokens, options, b, where),
    async generate(turns, options = {}) {
      const segmentIndex = b.firstSegmentIndex + issued.length;
      const requestId = b.requestIdFor(segmentIndex);
      const empty = (finishReason: FinishReason): EngineTurn => ({
        kind: "engine",
        requestId,
        tokens: [],
        logProbs: [],
        weightVersion: b.fallbackWeightVersion,
        finishReason,
        engineId: "none",
        text: "",
      });
      const prior = turns.filter((t): t is EngineTurn => t.kind === "engine");
      if (prior.length !== issued.length || prior.some((t, i) => t !== issued[i])) {
        throw invalid(where, "generate(turns) must be given every engine turn issued so far, in order (push each result into turns)");
      }
      const budget = Math.min(options.maxNewTokens ?? Infinity, remainingTokens(turns));
      let turn: EngineTurn;
      if (budget <= 0)
        turn = empty("length"); // slime: no request when the budget is spent
      else if (isStopped || b.isAborted?.()) turn = empty("abort");
      else {
        const images = requestImages(b, turns);
        b.inflight?.add(requestId);
        try {
          const r = await b.engine.generate({
            requestId,
            inputIds: [...promptAndResponse, ...turns.flatMap((t) => t.tokens)],
            ...(images.length > 0 ? { imageData: images.map(imageDataUri) } : {}),
            sampling: {
              ...b.sampling,
              ...(options.extraStopTokenIds ? { stopTokenIds: [...new Set([...b.sampling.stopTokenIds, ...options.extraStopTokenIds])] } : {}),
              ...(options.temperature ? { temperature: options.temperature } : {}),
              maxNewTokens: budget,
              seed: b.seedFor(segmentIndex),
            },
            ...(b.sessionKey ? { sessionKey: b.sessionKey } : {}),
          });
          if (r.tokenIds.length > budget) {
            throw new RlqError(
              "engine_bad_response",
              `engine ${r.engineId} returned ${r.tokenIds.length} tokens for a budget of ${budget} (request ${requestId})`,
            );
          }
          // An engine turn is one segment of one version: a turn that ran across a load in place keeps
          // its first version's tokens and ends as an abort there; the sample continues next round.
          const cut = r.versionSpans?.[0]?.end ?? r.tokenIds.length;
          turn = {
            kind: "engine",
            requestId,
            tokens: r.tokenIds.slice(0, cut),
            logProbs: r.logProbs.slice(0, cut),
            weightVersion: r.weightVersion,
            finishReason: r.versionSpans ? "abort" : r.finishReason,
            engineId: r.engineId,
            text: b.tokenizer.decode(r.tokenIds.slice(0, cut)),
          };
        } finally {
          b.inflight?.delete(requestId);
        }
      }
      if (turn.finishReason === "abort") isStopped = true;
      issued.push(turn);
      return turn;
    },
  };

  let raw: unknown;
  try {
    raw = await fn(b.args, structuredClone(b.sample), helpers);
  } catch (e) {
    if (e instanceof RlqError) throw e;
    throw new RlqError("plugin_threw", `${where} threw: ${(e as Error).message}`, { cause: e });
  }
  const parsed = customGenerateResultSchema.safeParse(raw);
  if (!parsed.success) {
    const detail = parsed.error.issues
      .slice(0, 3)
      .map((i) => `${i.path.join(".") || "(value)"}: ${i.message}`)
      .join("; ");
    throw invalid(where, `returned ${JSON.stringify(raw)?.slice(0, 200) ?? String(raw)}; expected {turns: [...], status?} (${detail})`, parsed.error);
  }
  return toSegments(parsed.data, issued, b, where);
}

/** `helpers.tool`: a tool turn from text (encoded without special tokens) or ids, with its images if any. */
function toolTurn(textOrTokens: string | readonly number[], options: ToolOptions, b: CustomGenerateBinding, where: string): ToolTurn {
  const images = options.images ?? [];
  if (images.length > 0) return imageToolTurn(textOrTokens, images, b, where);
  if (typeof textOrTokens === "string") return { kind: "tool", tokens: b.tokenizer.encode(textOrTokens), text: textOrTokens };
  return { kind: "tool", tokens: [...textOrTokens], text: b.tokenizer.decode(textOrTokens) };
}

/** What an engine call sends: the prompt's and earlier observations' images, then those of this round's tool turns so far. */
function requestImages(b: CustomGenerateBinding, turns: readonly Turn[]): ImageRef[] {
  return [...(b.images ?? []), ...turns.flatMap((t) => (t.kind === "tool" ? (t.images ?? []) : []))];
}

/** Check the validated turns against what was issued, and build the segments. */
function toSegments(result: CustomGenerateResult, issued: readonly EngineTurn[], b: CustomGenerateBinding, where: string): CustomGenerateOutcome {
  const turns = result.turns as Turn[];
  const engineTurns = turns.filter((t): t is EngineTurn => t.kind === "engine");
  if (engineTurns.length !== issued.length) {
    throw invalid(where, `returned ${engineTurns.length} engine turns but generate() was called ${issued.length} times; return every engine turn`);
  }
  engineTurns.forEach((t, i) => {
    const mine = issued[i] as EngineTurn;
    const same =
      t.requestId === mine.requestId &&
      t.weightVersion === mine.weightVersion &&
      t.tokens.length === mine.tokens.length &&
      t.tokens.every((x, j) => x === mine.tokens[j] && t.logProbs[j] === mine.logProbs[j]);
    if (!same) throw invalid(where, `engine turn ${i} (${t.requestId}) differs from what the engine returned; engine tokens and log-probs cannot be edited`);
  });
  const appended = turnsLength(turns);
  if (appended > b.budget) {
    throw invalid(
      where,
      `response_length would grow by ${appended} tokens, over the ${b.budget} left of rollout_max_response_len; check remainingTokens(turns) before appending tool output`,
    );
  }
  const abortedAt = engineTurns.findIndex((t) => t.finishReason === "abort");
  const last = engineTurns[engineTurns.length - 1];
  let status: SampleStatus;
  if (abortedAt >= 0)
    status = "aborted"; // resumed next round, like any aborted segment
  else if (result.status) status = result.status;
  else if (last) status = last.finishReason === "stop" ? "completed" : "truncated";
  else status = appended >= b.budget ? "truncated" : "completed";
  if (status === "completed" && appended >= b.budget && last?.finishReason === "length") status = "truncated";

  const segments: SegmentDraft[] = [];
  let prefix: Turn[] = [];
  for (const t of turns) {
    if (t.kind === "tool") {
      const seg = segments[segments.length - 1];
      if (seg) appendTool(seg, t);
      else prefix.push(t);
      continue;
    }
    const seg: SegmentDraft = {
      segmentIndex: b.firstSegmentIndex + segments.length,
      weightVersion: t.weightVersion,
      tokens: [],
      logProbs: [],
      lossMask: [],
      finishReason: t.finishReason,
      status: "pending",
      engine: t.engineId,
    };
    for (const p of prefix) appendTool(seg, p as ToolTurn);
    prefix = [];
    seg.tokens.push(...t.tokens);
    seg.logProbs.push(...t.logProbs);
    seg.lossMask.push(...t.tokens.map(() => 1));
    segments.push(seg);
  }
  if (prefix.length > 0) {
    const seg: SegmentDraft = {
      segmentIndex: b.firstSegmentIndex,
      weightVersion: b.fallbackWeightVersion,
      tokens: [],
      logProbs: [],
      lossMask: [],
      finishReason: "stop",
      status: "pending",
      engine: "tool",
    };
    for (const p of prefix) appendTool(seg, p as ToolTurn);
    segments.push(seg);
  }
  // An engine call that produced nothing (spent budget, aborted before it started) leaves no segment.
  // If nothing at all was produced: a spent budget is one empty truncated segment, an abort none
  // (both as in the plain rollout).
  let kept = segments.filter((s) => s.tokens.length > 0);
  const lastEmpty = segments[segments.length - 1];
  if (kept.length === 0 && lastEmpty && status !== "aborted") kept = [lastEmpty];
  kept.forEach((s, i) => (s.segmentIndex = b.firstSegmentIndex + i));
  const final = kept[kept.length - 1];
  if (final) {
    final.status = status;
    final.finishReason = status === "completed" ? "stop" : status === "truncated" ? "length" : status === "aborted" ? "abort" : final.finishReason;
  }
  for (const s of kept) {
    if (s.tokens.length !== s.lossMask.length || s.tokens.length !== s.logProbs.length) throw invalid(where, "internal: segment lengths differ"); // the invariant the trainer relies on
  }
  return { segments: kept, status, appendedTokens: appended };
}

function appendTool(seg: SegmentDraft, t: ToolTurn): void {
  if (t.images && t.images.length > 0) seg.images = [...(seg.images ?? []), ...t.images];
  seg.tokens.push(...t.tokens);
  seg.logProbs.push(...t.tokens.map(() => 0));
  seg.lossMask.push(...t.tokens.map(() => 0));
}

/** Occurrences of `needle` in `ids` (non-overlapping). */
export function countSequence(ids: readonly number[], needle: readonly number[]): number {
  if (needle.length === 0) return 0;
  let n = 0;
  for (let i = 0; i + needle.length <= ids.length; i++) {
    if (needle.every((x, j) => ids[i + j] === x)) {
      n++;
      i += needle.length - 1;
    }
  }
  return n;
}

/**
 * A tool turn with images: each loaded as the dataset loader loads one (checked, hashed, inline
 * bytes kept under the image store), the text's placeholders matched one to one with the images.
 * The engine expands each placeholder by its image (as for the prompt's), and the trainer's
 * processor counts placeholders against the sample's images, so a mismatch is refused here.
 */
function imageToolTurn(textOrTokens: string | readonly number[], inputs: readonly ImageInput[], b: CustomGenerateBinding, where: string): ToolTurn {
  const placeholder = b.imagePlaceholder ?? null;
  if (placeholder === null)
    throw invalid(where, "tool(..., { images }) needs a chat template that renders image parts (a vision-language hf_checkpoint with apply_chat_template)");
  const images = inputs.map((v, i) => {
    const img = loadImage(v, "image", "observation", `tool image ${i}`, b.imageLoad ?? { baseDir: "." });
    if (!img.ok) throw invalid(where, img.error);
    return img.value;
  });
  const placeholderIds = b.tokenizer.encode(placeholder);
  let tokens: number[];
  let text: string;
  if (typeof textOrTokens === "string") {
    text = textOrTokens.includes(placeholder) ? textOrTokens : placeholder.repeat(images.length) + textOrTokens;
    tokens = b.tokenizer.encode(text);
  } else {
    tokens = [...textOrTokens];
    text = b.tokenizer.decode(tokens);
  }
  const found = countSequence(tokens, placeholderIds);
  if (found !== images.length)
    throw invalid(
      where,
      `a tool turn with ${images.length} image(s) holds ${found} image placeholder(s) ${JSON.stringify(placeholder)}; give one per image, in order`,
    );
  return { kind: "tool", tokens, text, images };
}
