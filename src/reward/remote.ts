import { RlqError } from "../lib/errors.ts";
import { validatePluginReward } from "./plugin-contract.ts";
import type { RewardResult } from "./reward-result.ts";

/**
 * `rm_type: remote_rm`: a reward server over HTTP, as slime's `remote_rm`
 * (`slime/rollout/rm_hub/__init__.py`): one `POST rm_url` per sample with
 * `{"prompt", "response", "label"}`; the JSON answer is the reward (a number
 * or a dict of components, then `reward_key` picks one). A group is scored
 * as concurrent per-sample POSTs (slime's `batched_async_rm`), at most
 * `maxConcurrency` at a time.
 *
 * Retries (slime's): up to `maxAttempts` (10) tries, sleeping
 * `min(2^a, 30) + U(0, 1)` s after failed try `a` (0-based), while the whole
 * call stays within `totalTimeoutMs`. Retried: network errors, timeouts, 5xx,
 * 408, 429, and a body that is not JSON. Not retried: other 4xx (the server
 * refuses the request; asking again gives the same answer).
 *
 * A call that gives up throws `RemoteRewardError` whose message names the
 * URL, the attempts, the last HTTP status and an excerpt of the last body, and
 * whose `record` carries the same as data. It is `isRetriable` when the last
 * failure was transient, so the reward job is retried later and no sample is
 * lost; a valid JSON answer of the wrong shape is a non-retriable
 * `plugin_reward_invalid` (RewardError) naming the URL.
 */
export interface HttpRetryOptions {
  /** Tries in all, first included. Default 10 (slime). */
  maxAttempts?: number;
  /** Per-try timeout, ms. Default 120_000 (slime's aiohttp timeout). */
  requestTimeoutMs?: number;
  /** Budget for all tries and sleeps of one call, ms. Default 600_000. */
  totalTimeoutMs?: number;
  /** U(0,1) for the backoff jitter; default Math.random (inject a seeded one in tests). */
  random?: () => number;
  /** Sleep between tries; default setTimeout. Tests inject one that records and returns at once. */
  sleep?: (ms: number) => Promise<void>;
  /** Called after every failed try (log it: object first). */
  onAttemptFailed?: (failure: AttemptFailure) => void;
  /** Extra request headers (auth). */
  headers?: Record<string, string>;
}

export interface AttemptFailure {
  url: string;
  /** 1-based try number. */
  attempt: number;
  /** HTTP status, or null for a network error / timeout. */
  status: number | null;
  /** The first 500 characters of the response body, or null. */
  bodyExcerpt: string | null;
  error: string;
  isRetriable: boolean;
}

/** What a call that gave up leaves behind: stored in the job's failure reason and in the error. */
export interface RemoteFailureRecord {
  url: string;
  attempts: number;
  elapsedMs: number;
  status: number | null;
  bodyExcerpt: string | null;
  error: string;
  /** The sample's index in its group, when the call was for one sample. */
  sampleIndex?: number;
}

export class RemoteCallError extends RlqError {
  readonly record: RemoteFailureRecord;
  constructor(code: string, message: string, record: RemoteFailureRecord, isRetriable: boolean) {
    super(code, message, { isRetriable });
    this.name = "RemoteCallError";
    this.record = record;
  }
}

/** The remote reward gave up (code `remote_reward_failed`). */
export class RemoteRewardError extends RemoteCallError {
  constructor(message: string, record: RemoteFailureRecord, isRetriable: boolean) {
    super("remote_reward_failed", message, record, isRetriable);
    this.name = "RemoteRewardError";
  }
}

const EXCERPT_CHARS = 500;
const defaultSleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** slime's backoff after failed try `a` (0-based): min(2^a, 30) + U(0,1) seconds, in ms. */
export function backoffMs(attemptIndex: number, u: number): number {
  return (Math.min(2 ** attemptIndex, 30) + u) * 1000;
}

function isRetriableStatus(status: number): boolean {
  return status >= 500 || status === 408 || status === 429;
}

/**
 * POST `body` as JSON to `url` and return the parsed JSON answer, retrying as
 * described above. Throws `RemoteCallError` (`code`, default
 * `remote_call_failed`) with the failure record once it gives up.
 */
export async function postJsonWithRetry(
  url: string,
  body: unknown,
  options: HttpRetryOptions & { what?: string; code?: string; sampleIndex?: number } = {},
): Promise<unknown> {
  const maxAttempts = options.maxAttempts ?? 10;
  const requestTimeoutMs = options.requestTimeoutMs ?? 120_000;
  const totalTimeoutMs = options.totalTimeoutMs ?? 600_000;
  const random = options.random ?? Math.random;
  const sleep = options.sleep ?? defaultSleep;
  const payload = JSON.stringify(body);
  const started = Date.now();
  let last: AttemptFailure | null = null;
  let attempt = 0;
  while (attempt < maxAttempts) {
    attempt++;
    const remaining = totalTimeoutMs - (Date.now() - started);
    const failure = await tryOnce(url, payload, Math.max(1, Math.min(requestTimeoutMs, remaining)), options.headers, attempt);
    if (failure.ok) return failure.value;
    last = failure.failure;
    options.onAttemptFailed?.(last);
    if (!last.isRetriable || attempt >= maxAttempts) break;
    const delay = backoffMs(attempt - 1, random());
    if (Date.now() - started + delay >= totalTimeoutMs) break;
    await sleep(delay);
  }
  const f = last as AttemptFailure;
  const record: RemoteFailureRecord = {
    url,
    attempts: attempt,
    elapsedMs: Date.now() - started,
    status: f.status,
    bodyExcerpt: f.bodyExcerpt,
    error: f.error,
    ...(options.sampleIndex === undefined ? {} : { sampleIndex: options.sampleIndex }),
  };
  const why = f.isRetriable ? `gave up after ${attempt} ${attempt === 1 ? "try" : "tries"} in ${record.elapsedMs} ms` : "refused the request (not retried)";
  const status = f.status === null ? "no HTTP status" : `HTTP ${f.status}`;
  const bodyText = f.bodyExcerpt === null ? "" : `, body: ${JSON.stringify(f.bodyExcerpt)}`;
  const forSample = options.sampleIndex === undefined ? "" : ` for sample ${options.sampleIndex}`;
  const message = `${options.what ?? "POST"} ${url}${forSample} ${why}: ${status}, ${f.error}${bodyText}`;
  if ((options.code ?? "remote_call_failed") === "remote_reward_failed") throw new RemoteRewardError(message, record, f.isRetriable);
  throw new RemoteCallError(options.code ?? "remote_call_failed", message, record, f.isRetriable);
}

type TryResult = { ok: true; value: unknown } | { ok: false; failure: AttemptFailure };

async function tryOnce(url: string, payload: string, timeoutMs: number, headers: Record<string, string> | undefined, attempt: number): Promise<TryResult> {
  const fail = (status: number | null, bodyExcerpt: string | null, error: string, isRetriable: boolean): TryResult => ({
    ok: false,
    failure: { url, attempt, status, bodyExcerpt, error, isRetriable },
  });
  let res: Response;
  let text: string;
  try {
    res = await fetch(url, {
      method: "POST",
      headers: { "content-type": "application/json", accept: "application/json", ...headers },
      body: payload,
      signal: AbortSignal.timeout(timeoutMs),
    });
    text = await res.text();
  } catch (e) {
    const err = e as Error & { cause?: { code?: string } };
    const isTimeout = err.name === "TimeoutError" || err.name === "AbortError";
    const detail = isTimeout ? `timed out after ${timeoutMs} ms` : `${err.message}${err.cause?.code ? ` (${err.cause.code})` : ""}`;
    return fail(null, null, detail, true);
  }
  const excerpt = text.length > EXCERPT_CHARS ? `${text.slice(0, EXCERPT_CHARS)}…` : text;
  if (!res.ok) return fail(res.status, excerpt, `status ${res.status} ${res.statusText}`.trim(), isRetriableStatus(res.status));
  try {
    return { ok: true, value: JSON.parse(text) as unknown };
  } catch {
    // A proxy's HTML error page or a half-written body: transient more often than not.
    return fail(res.status, excerpt, "the body is not JSON", true);
  }
}

/** What slime's remote_rm sends. `label` is the dataset label as stored (string or null). */
export interface RemoteRewardSample {
  prompt: string;
  response: string;
  label: string | null;
}

export interface RemoteRewardOptions extends HttpRetryOptions {
  /** slime --rm-url. */
  url: string;
  /** Most POSTs of one group in flight. Default 64. */
  maxConcurrency?: number;
}

export interface RemoteReward {
  /** One sample: validated reward (number or components). */
  scoreSample(sample: RemoteRewardSample, sampleIndex?: number): Promise<RewardResult>;
  /** A group: one result per sample, in order; concurrent up to maxConcurrency. */
  scoreGroup(samples: readonly RemoteRewardSample[]): Promise<RewardResult[]>;
}

export function createRemoteReward(options: RemoteRewardOptions): RemoteReward {
  if (!/^https?:\/\//.test(options.url)) {
    throw new RlqError("config_invalid", `rm_url ${JSON.stringify(options.url)}: expected an http:// or https:// URL`);
  }
  const maxConcurrency = Math.max(1, options.maxConcurrency ?? 64);
  const scoreSample = async (sample: RemoteRewardSample, sampleIndex?: number): Promise<RewardResult> => {
    const body = { prompt: sample.prompt, response: sample.response, label: sample.label };
    const value = await postJsonWithRetry(options.url, body, {
      ...options,
      what: "remote_rm POST",
      code: "remote_reward_failed",
      ...(sampleIndex === undefined ? {} : { sampleIndex }),
    });
    return validatePluginReward(value, { option: "rm_url", path: options.url, ...(sampleIndex === undefined ? {} : { sampleIndex }) });
  };
  return {
    scoreSample,
    async scoreGroup(samples) {
      const out: RewardResult[] = new Array<RewardResult>(samples.length);
      let next = 0;
      const lane = async () => {
        while (next < samples.length) {
          const i = next++;
          out[i] = await scoreSample(samples[i] as RemoteRewardSample, i);
        }
      };
      await Promise.all(Array.from({ length: Math.min(maxConcurrency, samples.length) }, lane));
      return out;
    },
  };
}

/**
 * The shape `createRewardScorer`'s `resolveRmType` returns: a per-sample
 * function (may return a promise). Use for `rm_type: remote_rm`.
 */
export function remoteRewardFunction(options: RemoteRewardOptions): (s: RemoteRewardSample & { sampleIndex?: number }) => Promise<RewardResult> {
  const client = createRemoteReward(options);
  return (s) => client.scoreSample({ prompt: s.prompt, response: s.response, label: s.label }, s.sampleIndex);
}
