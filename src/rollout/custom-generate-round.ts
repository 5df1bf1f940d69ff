/** One rollout round of a sample through `custom_generate_function_path` (custom-generate.ts runs the function). */

import type { Engine } from "../engines/engine.ts";
import type { AssembledSample, ImageRef } from "../core/sample.ts";
import type { ImageLoadOptions } from "../data/images.ts";
import type { RunConfig } from "../config/run-config.ts";
import type { Tokenizer } from "../data/tokenizer.ts";
import { requestId } from "../queue/payloads.ts";
import { seedFrom } from "../lib/hash.ts";
import { runCustomGenerate, type CustomGenerateFunction, type SegmentDraft } from "./custom-generate.ts";
import { runSampling } from "./sampling-params.ts";

/**
 * The run tokenizer's `encode` without the special tokens it puts in front
 * (the bytes and demo tokenizers prepend BOS, an HF tokenizer adds nothing):
 * whatever `encode("")` yields is stripped. Tool text goes mid-response.
 */
export function encoderWithoutPrefix(tokenizer: Pick<Tokenizer, "encode" | "decode">): {
  encode(text: string): number[];
  decode(ids: readonly number[]): string;
} {
  const prefix = tokenizer.encode("");
  return {
    encode: (text) => {
      const ids = tokenizer.encode(text);
      return prefix.every((id, i) => ids[i] === id) ? ids.slice(prefix.length) : ids;
    },
    decode: (ids) => tokenizer.decode(ids),
  };
}

/** What the rollout job knows about one unfinished sample of its round. */
export interface CustomRoundInput {
  runId: string;
  groupId: number;
  round: number;
  /** The job's weight version (recorded for a tool-only round). */
  weightVersion: number;
  config: RunConfig;
  tokenizer: Pick<Tokenizer, "encode" | "decode" | "eosId">;
  prompt: { prompt: string; promptTokens: readonly number[]; label: string | null; metadata: unknown; images?: readonly ImageRef[] };
  /** The chat template's image placeholder (null: tool turns carry no image). */
  imagePlaceholder?: string | null;
  /** Where observation images given as relative paths are read and inline ones kept. */
  imageLoad?: ImageLoadOptions;
  sample: AssembledSample;
  /** The configured path or URL, for messages. */
  pluginPath: string;
}

/**
 * The drop-in for `generateSegment` in generate-group-round.ts when
 * `custom_generate_function_path` is set: the same budget, request ids,
 * seeds, session key and sampling params, returning the round's segments
 * for `writeRound` (possibly several: one per engine call). Null engine (the
 * round was aborted before it started): no segments.
 */
export async function generateCustomRound(
  fn: CustomGenerateFunction,
  engine: Engine | null,
  input: CustomRoundInput,
  inflight: Set<string>,
  isAborted: () => boolean,
): Promise<Array<SegmentDraft & { sampleIndex: number; round: number; tokenStart: number; error: null }>> {
  const c = input.config;
  const s = input.sample;
  let budget = c.rollout_max_response_len - s.responseTokens.length;
  if (c.rollout_max_context_len !== null) budget = Math.min(budget, c.rollout_max_context_len - input.prompt.promptTokens.length - s.responseTokens.length);
  if (engine === null || (isAborted() && budget > 0)) return [];
  const io = encoderWithoutPrefix(input.tokenizer);
  // The prompt's images, then the observations of the sample's earlier rounds (a resumed sample).
  const images = [...(input.prompt.images ?? []), ...(s.images ?? [])];
  const out = await runCustomGenerate(fn, {
    engine,
    args: c,
    sample: {
      sampleIndex: s.sampleIndex,
      groupId: input.groupId,
      round: input.round,
      prompt: input.prompt.prompt,
      promptTokens: [...input.prompt.promptTokens],
      responseTokens: [...s.responseTokens],
      response: io.decode(s.responseTokens),
      label: input.prompt.label,
      metadata: (input.prompt.metadata as Record<string, unknown> | null) ?? {},
      status: s.status,
      ...(images.length > 0 ? { imageHashes: images.map((i) => i.sha256) } : {}),
    },
    images,
    imagePlaceholder: input.imagePlaceholder ?? null,
    ...(input.imageLoad ? { imageLoad: input.imageLoad } : {}),
    sampling: runSampling(c, input.tokenizer.eosId),
    budget: Math.max(0, budget),
    firstSegmentIndex: s.nextSegmentIndex,
    requestIdFor: (seg) => requestId(input.runId, input.groupId, s.sampleIndex, seg),
    seedFor: (seg) => seedFrom(c.rollout_seed, input.groupId, s.sampleIndex, seg),
    sessionKey: `${input.runId}-${input.groupId}-${s.sampleIndex}`,
    fallbackWeightVersion: input.weightVersion,
    tokenizer: io,
    inflight,
    isAborted,
    where: `custom_generate_function_path ${input.pluginPath}`,
  });
  let tokenStart = s.responseTokens.length;
  return out.segments.map((seg) => {
    const row = { ...seg, sampleIndex: s.sampleIndex, round: input.round, tokenStart, error: null };
    tokenStart += seg.tokens.length;
    return row;
  });
}
