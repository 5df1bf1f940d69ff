/**
 * `rm_type: remote_rm`: a reward server over HTTP, as slime's `remote_rm`
 * (`slime/rollout/rm_hub/__init__.py`): one `POST rm_url` per sample with
 * `{"prompt", "response", "label"}`; the JSON answer is the reward (a number
 * or a dict of components, then `reward_key` picks one). A group is scored
 * as concurrent per-sample POSTs (slime's `batched_async_rm`), at most
 * `maxConcurrency` at a time.
 *
 * Retries (slime's, lib/http-client.ts `postJsonWithRetry`): up to
 * `maxAttempts` (10) tries, sleeping `min(2^a, 30) + U(0, 1)` s after failed
 * try `a` (0-based), while the whole call stays within `totalTimeoutMs`.
 * Retried: network errors, timeouts, 5xx, 408, 429, and a body that is not
 * JSON. Not retried: other 4xx (the server refuses the request; asking again
 * gives the same answer).
 *
 * A call that gives up throws `RemoteRewardError` whose message names the
 * URL, the attempts, the last HTTP status and an excerpt of the last body, and
 * whose `record` carries the same as data. It is `isRetriable` when the last
 * failure was transient, so the reward job is retried later and no sample is
 * lost; a valid JSON answer of the wrong shape is a non-retriable
 * `plugin_reward_invalid` (RewardError) naming the URL.
 */

import { RlqError } from "../lib/errors.ts";
import { postJsonWithRetry, RemoteCallError, type HttpRetryOptions, type RemoteFailureRecord } from "../lib/http-client.ts";

import { validatePluginReward } from "./plugin-contract.ts";
import type { RewardResult } from "./reward-result.ts";
export { backoffMs, type AttemptFailure } from "../lib/http-client.ts";

/** The remote reward gave up (code `remote_reward_failed`). */
export class RemoteRewardError extends RemoteCallError {
  constructor(message: string, record: RemoteFailureRecord, isRetriable: boolean) {
    super("remote_reward_failed", message, record, isRetriable);
    this.name = "RemoteRewardError";
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
      makeError: (message, record, isRetriable) => new RemoteRewardError(message, record, isRetriable),
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
