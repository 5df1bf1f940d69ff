import type { RoundFacts } from "../store/rollout-facts.ts";
import type { GroupView } from "../store/group-view.ts";
import { createWaker } from "../store/notify.ts";
import type { JobStore } from "../store/job-batch.ts";
import type { Engine, GenerateResult } from "../engines/engine.ts";
import { requestId, type RolloutJob } from "../queue/payloads.ts";
import type { RunContext } from "../runtime/run-context.ts";
import { isTerminal, statusFromFinish, type AssembledSample } from "../core/sample.ts";
import { seedFrom } from "../lib/hash.ts";
import { errorMessage, RlqError } from "../lib/errors.ts";
import { isRequestError } from "../engines/remote.ts";
import { generateCustomRound } from "../rollout/custom-generate-round.ts";
import { runSampling } from "../rollout/sampling-params.ts";
import { resolve } from "node:path";
import { imageDataUri } from "../data/images.ts";
import { imagePlaceholderOf } from "../data/chat-template.ts";
import { readEnv } from "../config/env.ts";
import type { ImageRef } from "../core/sample.ts";
import { chooseGroupSamples, isGroupSettled, type GroupCandidate } from "../core/early-completion.ts";

/**
 * Rounds one group may take. A sample aborted again and again (a server that
 * keeps aborting it, syncs that keep interrupting it) fails with a reason at
 * this round instead of being resubmitted forever.
 */
export const MAX_ROUNDS_PER_GROUP = 64;

/**
 * The rollout job: one round of one group. Every sample that is not
 * finished continues from its tokens so far with the remaining budget;
 * the round's segments and its marker land in one transaction.
 * While generating it watches for an abort of this round (the step's seal in
 * sync mode, a weight sync in async mode): its requests are then aborted by
 * id and the partial tokens kept.
 */
export interface RolloutDeps {
  /** The job's statements, coalesced with the other jobs of this worker (store/job-batch.ts). */
  store: JobStore;
  engineFor(ctx: RunContext, weightVersion: number): Promise<Engine>;
  /** Called after the round is written and complete: enqueue its reward job. */
  onRoundComplete(job: RolloutJob): Promise<void>;
  abortPollMs?: number;
  /** Wake-ups when the controller commits aborts for a run (store/notify.ts `rlq_abort`): the watcher looks at once. */
  abortHints?: (runId: string, wake: () => void) => () => void;
  /** Where the watcher tells a failed abort check or abort (the round then ends by itself, later). */
  log?: { warn(obj: object, msg: string): void };
}

/**
 * The watcher's look at whether the round was aborted. A failed look answers false and is asked
 * again at the next poll; the first failure of a streak is told, and the count when a look answers
 * again (a database outage would otherwise log every poll of every rollout job).
 */
function abortCheck(deps: RolloutDeps, job: RolloutJob): () => Promise<boolean> {
  const where = { runId: job.runId, groupId: job.groupId, round: job.round };
  let failedChecks = 0;
  return () =>
    deps.store.isRoundAborted(job).then(
      (v) => {
        if (failedChecks > 0) deps.log?.warn({ ...where, failedChecks }, "rollout: abort check answers again");
        failedChecks = 0;
        return v;
      },
      (e: unknown) => {
        if (failedChecks++ === 0) deps.log?.warn({ ...where, err: errorMessage(e) }, "rollout: abort check failed (asked again at each poll)");
        return false;
      },
    );
}

/**
 * The image placeholder of the chat template the prompts were rendered with (hf_checkpoint's, as
 * the dataset loader uses it; data/chat-template.ts `imagePlaceholderOf`), once per run context.
 * Null without apply_chat_template: tool turns of such a run carry no image.
 */
const placeholders = new WeakMap<RunContext, Promise<string | null>>();
function imagePlaceholder(ctx: RunContext): Promise<string | null> {
  let hit = placeholders.get(ctx);
  if (!hit) {
    const c = ctx.config;
    hit =
      c.apply_chat_template && c.hf_checkpoint
        ? import("../engines/hf-tokenizer.ts").then(async ({ loadHfTokenizer }) => imagePlaceholderOf(await loadHfTokenizer(c.hf_checkpoint as string)))
        : Promise.resolve(null);
    placeholders.set(ctx, hit);
  }
  return hit;
}

export async function generateGroupRound(deps: RolloutDeps, ctx: RunContext, job: RolloutJob, jobId: string): Promise<void> {
  const { store } = deps;
  const { runId, groupId, round, step } = job;
  const c = ctx.config;
  // One round trip: the dispatch decision, the round's marker, an abort, and the group so far.
  const start = await store.loadRolloutView(job, c.n_samples_per_prompt);
  if (!start.isDispatched) {
    throw new RlqError("no_decision_behind_job", `rollout job ${jobId}: no dispatch decision for group ${groupId} round ${round} step ${step}`);
  }
  if (start.hasRound || start.view === null) {
    await deps.onRoundComplete(job); // idempotent: the reward job id is deterministic
    return;
  }
  const view = start.view;
  let wasAborted = start.isAborted;
  const engine = wasAborted ? null : await deps.engineFor(ctx, job.weightVersion);
  const pending = view.samples.filter((s) => !isTerminal(s.status));
  const inflight = new Set<string>();
  let watching = engine !== null && pending.length > 0;
  // The watcher's sleep is cut short when the round ends (a job must not wait
  // out a poll interval after its last token: that alone capped throughput),
  // and when the controller commits an abort for this run (a seal, a sync).
  const waker = createWaker();
  const stopHints = watching && deps.abortHints ? deps.abortHints(runId, waker.wake) : () => undefined;
  const isRoundAborted = abortCheck(deps, job);
  const watcher = (async () => {
    while (watching) {
      await waker.wait(deps.abortPollMs ?? 250);
      waker.clear();
      if (!watching) break;
      // After a failed abort the requests run to their own end and the round is still written as aborted (wasAborted).
      if (await isRoundAborted()) {
        wasAborted = true;
        watching = false;
        if (engine)
          await engine
            .abort([...inflight])
            .catch((e: unknown) =>
              deps.log?.warn({ runId, groupId, round, requests: inflight.size, err: errorMessage(e) }, "rollout: abort failed (the requests run to their end)"),
            );
      }
    }
  })();

  let segments: RoundFacts["segments"];
  try {
    segments = await generatePending(deps, ctx, job, view, pending, engine, inflight, () => wasAborted);
  } finally {
    watching = false;
    stopHints();
    waker.wake();
    await watcher;
  }
  const finalStatus = new Map(view.samples.map((s) => [s.sampleIndex, s.status]));
  for (const seg of segments) finalStatus.set(seg.sampleIndex, seg.status);
  const isComplete = [...finalStatus.values()].every(isTerminal);
  segments.sort((a, b) => a.sampleIndex - b.sampleIndex);
  await store.writeRound({
    runId,
    groupId,
    round,
    step,
    jobId,
    expectedWeightVersion: job.weightVersion,
    segments,
    isComplete,
    // A sample's last segment says how its request ended; the earlier segments of one request ended
    // at a weight version boundary (an in-place load), not at an abort.
    wasAborted: wasAborted || lastPerSample(segments).some((s) => s.finishReason === "abort"),
  });
  if (isComplete) await deps.onRoundComplete(job);
}

/**
 * The round's requests: each pending sample's next segment(s), through the custom generate function
 * when the run has one; or, for a fresh group's first round with group_extra_samples, n + extra
 * candidates raced (early group completion).
 */
async function generatePending(
  deps: RolloutDeps,
  ctx: RunContext,
  job: RolloutJob,
  view: GroupView,
  pending: readonly AssembledSample[],
  engine: Engine | null,
  inflight: Set<string>,
  isAborted: () => boolean,
): Promise<RoundFacts["segments"]> {
  const c = ctx.config;
  const images = view.prompt.images ?? [];
  const isEarly =
    c.group_extra_samples > 0 &&
    job.round === 0 &&
    !ctx.customGenerate &&
    engine !== null &&
    pending.length === view.samples.length &&
    pending.every((s) => s.responseTokens.length === 0 && s.nextSegmentIndex === 0);
  if (isEarly) return generateCandidates(engine, ctx, view.prompt.promptTokens, pending, job, inflight, isAborted, images, deps.log);
  const perSample = await Promise.all(
    pending.map(async (s) => {
      if (!ctx.customGenerate) return generateSegments(engine, ctx, view.prompt.promptTokens, s, job, inflight, isAborted, images);
      const input = {
        runId: job.runId,
        groupId: job.groupId,
        round: job.round,
        weightVersion: job.weightVersion,
        config: c,
        tokenizer: ctx.tokenizer,
        prompt: view.prompt,
        sample: s,
        pluginPath: c.custom_generate_function_path as string,
        imagePlaceholder: await imagePlaceholder(ctx),
        // Observation images: relative paths from the worker's directory (where plugin paths resolve),
        // inline bytes kept by hash under RLQ_HOME/images like a dataset's.
        imageLoad: { baseDir: process.cwd(), imageStoreDir: resolve(readEnv().RLQ_HOME, "images") },
      };
      return generateCustomRound(ctx.customGenerate, engine, input, inflight, isAborted);
    }),
  );
  return perSample.flat();
}

/**
 * Early group completion (core/early-completion.ts): the group's n fresh samples race with
 * `group_extra_samples` more candidates drawn from the same prompt (candidate i has its own request
 * id and seed). Once n candidates reached a terminal status the others are aborted by id; the first n
 * to finish become the group's samples 0..n-1 (in candidate order), or, for a round a weight sync
 * ended first, the finished ones and then those with the most tokens. The dropped candidates' tokens
 * are not recorded: they are work the engines did for nothing, traded for the group's tail.
 */
async function generateCandidates(
  engine: Engine,
  ctx: RunContext,
  promptTokens: readonly number[],
  pending: readonly AssembledSample[],
  job: RolloutJob,
  inflight: Set<string>,
  isAborted: () => boolean,
  images: readonly ImageRef[],
  log: RolloutDeps["log"],
): Promise<RoundFacts["segments"]> {
  const n = pending.length;
  const template = pending[0] as AssembledSample;
  const candidates = Array.from({ length: n + ctx.config.group_extra_samples }, (_, i): AssembledSample => ({ ...template, sampleIndex: i }));
  const results: Array<Awaited<ReturnType<typeof generateSegment>>> = candidates.map(() => null);
  const finishedOrder: Array<number | null> = candidates.map(() => null);
  const mine = new Set<string>();
  let finished = 0;
  let isSettled = false;
  const ridOf = (i: number) => requestId(job.runId, job.groupId, i, 0);
  await Promise.all(
    candidates.map(async (cand, i) => {
      mine.add(ridOf(i));
      const seg = await generateSegment(engine, ctx, promptTokens, cand, job, inflight, () => isAborted() || isSettled, images);
      mine.delete(ridOf(i));
      results[i] = seg;
      if (seg === null || !isTerminal(seg.status) || isSettled) return;
      finishedOrder[i] = finished++;
      if (!isGroupSettled(finished, n)) return;
      isSettled = true;
      // The stragglers end now with what they have; they are dropped below.
      const stragglers = [...mine].filter((rid) => inflight.has(rid));
      if (stragglers.length > 0)
        await engine.abort(stragglers).catch((e: unknown) => {
          // Nothing is lost: an unaborted straggler runs to its end and is dropped all the same.
          log?.warn(
            { runId: job.runId, groupId: job.groupId, requests: stragglers.length, err: errorMessage(e) },
            "rollout: aborting a group's stragglers failed",
          );
        });
    }),
  );
  const chosen = chooseGroupSamples(
    candidates.map((cand, i): GroupCandidate => ({ index: i, tokens: results[i]?.tokens.length ?? 0, finishedOrder: finishedOrder[i] ?? null })),
    n,
  );
  return chosen.flatMap((from, to) => {
    const seg = results[from];
    if (!seg) return [];
    // A candidate that ran across an in-place load holds tokens of two versions: one segment per version.
    const { versionSpans, ...whole } = seg;
    return splitAtVersions({ ...whole, sampleIndex: (pending[to] as AssembledSample).sampleIndex }, versionSpans);
  });
}

/** The segment with the highest index of each sample. */
function lastPerSample(segments: RoundFacts["segments"]): RoundFacts["segments"] {
  const last = new Map<number, RoundFacts["segments"][number]>();
  for (const s of segments) if ((last.get(s.sampleIndex)?.segmentIndex ?? -1) < s.segmentIndex) last.set(s.sampleIndex, s);
  return [...last.values()];
}

/**
 * One request's segments: one, or one per weight version where the engine was loaded in place
 * under the request (GenerateResult.versionSpans). Each earlier piece ends at a version boundary,
 * as a continued segment ends ("abort", the sample not finished); the last says how it ended.
 */
async function generateSegments(
  engine: Engine | null,
  ctx: RunContext,
  promptTokens: readonly number[],
  sample: AssembledSample,
  job: RolloutJob,
  inflight: Set<string>,
  isAborted: () => boolean,
  images: readonly ImageRef[],
): Promise<RoundFacts["segments"]> {
  // A sample with observation images (an earlier custom generate round) sends them after the prompt's.
  const all = sample.images && sample.images.length > 0 ? [...images, ...sample.images] : images;
  const seg = await generateSegment(engine, ctx, promptTokens, sample, job, inflight, isAborted, all);
  if (seg === null) return [];
  const { versionSpans, ...whole } = seg;
  return splitAtVersions(whole, versionSpans);
}

/** `whole` as one segment per span of `spans` (absent: itself). Pure. */
export function splitAtVersions(whole: RoundFacts["segments"][number], spans: GenerateResult["versionSpans"]): RoundFacts["segments"] {
  if (spans === undefined) return [whole];
  return spans.map((span, i) => {
    const isLast = i === spans.length - 1;
    return {
      ...whole,
      segmentIndex: whole.segmentIndex + i,
      tokenStart: whole.tokenStart + span.start,
      weightVersion: span.version,
      tokens: whole.tokens.slice(span.start, span.end),
      logProbs: whole.logProbs.slice(span.start, span.end),
      lossMask: whole.lossMask.slice(span.start, span.end),
      ...(isLast ? {} : { finishReason: "abort", status: "aborted" as const, error: null }),
    };
  });
}

async function generateSegment(
  engine: Engine | null,
  ctx: RunContext,
  promptTokens: readonly number[],
  sample: AssembledSample,
  job: RolloutJob,
  inflight: Set<string>,
  isAborted: () => boolean,
  images: readonly ImageRef[] = [],
): Promise<(RoundFacts["segments"][number] & { versionSpans?: GenerateResult["versionSpans"] }) | null> {
  const c = ctx.config;
  const segmentIndex = sample.nextSegmentIndex;
  const base = {
    sampleIndex: sample.sampleIndex,
    segmentIndex,
    round: job.round,
    tokenStart: sample.responseTokens.length,
    error: null,
  };
  let budget = c.rollout_max_response_len - sample.responseTokens.length;
  if (c.rollout_max_context_len !== null) budget = Math.min(budget, c.rollout_max_context_len - promptTokens.length - sample.responseTokens.length);
  if (budget <= 0) {
    // slime: no request; the sample is truncated.
    return { ...base, weightVersion: job.weightVersion, tokens: [], logProbs: [], lossMask: [], finishReason: "length", status: "truncated", engine: "none" };
  }
  if (engine === null || isAborted()) return null;
  const rid = requestId(job.runId, job.groupId, sample.sampleIndex, segmentIndex);
  inflight.add(rid);
  let result: GenerateResult;
  const failed = (reason: string) => ({
    ...base,
    error: reason,
    weightVersion: job.weightVersion,
    tokens: [],
    logProbs: [],
    lossMask: [],
    finishReason: "error",
    status: "failed" as const,
    engine: "none",
  });
  try {
    result = await engine.generate({
      requestId: rid,
      // Prefix affinity: a continued segment goes back to the engine holding its prefix cache.
      sessionKey: `${job.runId}-${job.groupId}-${sample.sampleIndex}`,
      // With engine.batch_group: one batch /generate per group at most (engines/sglang-batcher.ts `SglangBatcher`).
      batchKey: `${job.runId}-${job.groupId}`,
      inputIds: [...promptTokens, ...sample.responseTokens],
      // Every segment re-sends the prompt's images with the prompt (a continued segment, a resumed
      // run): read from where drawn_prompts says they are, checked against their recorded sha256.
      ...(images.length > 0 ? { imageData: images.map(imageDataUri) } : {}),
      sampling: {
        ...runSampling(c, ctx.tokenizer.eosId),
        maxNewTokens: budget,
        seed: seedFrom(c.rollout_seed, job.groupId, sample.sampleIndex, segmentIndex),
      },
    });
  } catch (e) {
    // The server refused this request for itself (a prompt over the context length): the sample
    // fails with the reason; the engine and the other samples are not affected.
    if (isRequestError(e)) return failed(e.message);
    throw e;
  } finally {
    inflight.delete(rid);
  }
  if (result.tokenIds.length > budget) {
    throw new RlqError("engine_bad_response", `engine ${result.engineId} returned ${result.tokenIds.length} tokens for a budget of ${budget} (request ${rid})`);
  }
  let status = statusFromFinish(result.finishReason);
  if (status === "aborted" && result.tokenIds.length === budget) status = "truncated";
  let error: string | null = null;
  if (status === "aborted" && job.round + 1 >= MAX_ROUNDS_PER_GROUP) {
    status = "failed";
    error = `aborted in ${MAX_ROUNDS_PER_GROUP} rounds (the most one group may take); last engine ${result.engineId}`;
  }
  return {
    ...base,
    weightVersion: result.weightVersion,
    tokens: result.tokenIds,
    logProbs: result.logProbs,
    lossMask: result.tokenIds.map(() => 1),
    finishReason: result.finishReason,
    status,
    engine: result.engineId,
    error,
    ...(result.versionSpans ? { versionSpans: result.versionSpans } : {}),
  };
}
