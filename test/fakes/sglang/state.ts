/**
 * The fake SGLang's state (test/fakes/fake-sglang.ts is the server; its header documents every
 * behaviour with the SGLang source it comes from): options from the command line, the live
 * requests, the counters tests read on /stats, the weight version and the injected fault.
 */
import type { ServerResponse } from "node:http";
import type { LogprobMode } from "../fake-lm.ts";

/** Set once from the command line by fake-sglang.ts. */
export const opts = {
  tokenDelayMs: 0,
  stopProb: 0.08,
  logprobMode: "scaled" as LogprobMode,
  loadDelayMs: 0,
  apiKey: undefined as string | undefined,
  contextLength: 32768,
  isDeterministic: false,
  isIncremental: false,
  streamInterval: 1,
  hasSpans: false,
  /** --api-layout 0.5: the 0.5.x routes and event shapes instead of the newest server's. */
  isOldLayout: false,
  /** --admin-api-key: the only key the admin routes take when set (utils/auth.py ADMIN_OPTIONAL). */
  adminApiKey: undefined as string | undefined,
  healthBlockMs: 20_000,
  healthPollMs: 1000,
  tpSize: 1,
  disconnectAbortDelayMs: 2000,
  isInstant: false,
  /** --frontend rust: the embedded Rust server's routes and frames (fake-sglang.ts documents them). */
  isRustFrontend: false,
  /** --dp-size / --enable-dp-attention: the push routes assert dp_size == 1 or DP attention. */
  dpSize: 1,
  isDpAttention: false,
  /**
   * --policy-url: the tokens and log-probs come from a real model (test/fakes/hf-vlm-policy.py) instead
   * of fake-lm.ts, and disk loads load its weights; the fake keeps the protocol, faults and versions.
   */
  policyUrl: undefined as string | undefined,
};

export type FaultMode = "none" | "5xx" | "hang" | "abort_mid" | "error_abort" | "error_event" | "reset" | "die" | "stale_version";
export interface Fault {
  mode: FaultMode;
  afterTokens: number;
  /** 5xx / reset: answers left to fail; -1 = all. */
  count: number;
  version: number;
  scope: "generate" | "all";
  statusCode: number;
  /** error_event: the event's `retryable`. */
  isRetryable: boolean;
}

/** What changes while the server runs. */
export const st = {
  weightVersion: 0,
  fault: { mode: "none", afterTokens: 0, count: -1, version: 0, scope: "generate", statusCode: 500, isRetryable: false } as Fault,
  /** Bumped by every POST /_fault: a hang ends when its fault is replaced. */
  faultEpoch: 0,
  /** Loads wait for in-flight requests; new requests wait for a load (SGLang's model update lock). */
  loading: null as Promise<void> | null,
  drained: null as (() => void) | null,
  paused: null as Promise<void> | null,
  pauseMode: "abort" as "abort" | "in_place" | "retract",
  resume: null as (() => void) | null,
  /** Released GPU memory by tag (managers/scheduler.py `self.offload_tags = set()`; scheduler_update_weights_mixin.py). */
  offloadTags: new Set<string>(),
};
export interface LiveRequest {
  aborted: boolean;
  /** The request's image_data entries as sent (data URIs or paths), for --policy-url. */
  imageData?: readonly string[];
}
export const live = new Map<string, LiveRequest>();
export const stats = {
  generate: 0,
  batches: 0,
  aborted: 0,
  loads: 0,
  abortRequests: 0,
  failed5xx: 0,
  maxLive: 0,
  refused: 0,
  duplicates: 0,
  unauthorized: 0,
  /** Admin routes refused for want of the admin key. */
  adminRefused: 0,
  /** Calls to /get_model_info and /get_server_info, which the newest server logs as "will be removed". */
  deprecatedCalls: 0,
  /** Push calls refused by the dp_size assertion (--dp-size > 1 without DP attention). */
  dpAssertions: 0,
  bytesSent: 0,
  /** Tokens decoded so far, all requests: tests wait on it instead of sleeping. */
  tokensGenerated: 0,
  healthBusy: 0,
  /** /health_generate calls received. */
  healthChecks: 0,
  pauses: 0,
  flushes: 0,
  /** The last update_weights_from_distributed body's names, dtypes and shapes. */
  lastPush: null as null | { names: unknown; dtypes: unknown; shapes: unknown; group_name: unknown },
  /** The last update_weights_from_tensor body, as checked (the tensors themselves stay opaque). */
  lastTensorPush: null as null | { count: number; bytes: number[]; load_format: unknown; flush_cache: boolean; weight_version: unknown },
  /** Every push and load in order, with whether requests were live when it applied (tests read the order). */
  calls: [] as string[],
  groups: [] as unknown[],
  /** /abort_request with abort_all (rlq must never send one: other runs share the server). */
  abortAlls: 0,
  /** /flush_cache answers: refused while requests ran, done. */
  flushRefused: 0,
  cacheFlushes: 0,
  seedsSeen: [] as number[],
  /** Per request id: the sha256 of each image of its image_data, in order (generate.ts imagesOf). */
  imagesSeen: {} as Record<string, string[]>,
  /** TCP connections accepted (a client's connection pooling shows here). */
  connections: 0,
  /** Colocated mode: /release_memory_occupation and /resume_memory_occupation calls that succeeded. */
  releases: 0,
  resumes: 0,
  /** Calls that the real server would die on (an assertion or a KeyError in its scheduler): tests expect none. */
  memoryFaults: [] as string[],
  /** Generate requests and loads that came while memory they need was released (rlq must send none). */
  generateWhileReleased: 0,
  /** The rid of each generate request that came while released (its origin: a probe, a rollout, ...). */
  generateWhileReleasedRids: [] as string[],
  loadWhileReleased: 0,
  /** /health_generate calls while released: each is a generation in the real server (rlq must send none). */
  healthWhileReleased: 0,
  /** The model_path of each update_weights_from_disk that loaded, in order. */
  loadedPaths: [] as string[],
  /** Per weight version, when (epoch ms) the first request started generating on it. */
  firstGenerateAt: {} as Record<string, number>,
};
/** Groups made by /init_weights_update_group (model_runner.py keeps them by group_name). */
export const groupNames = new Set<string>();

export const reportedVersion = () => (st.fault.mode === "stale_version" ? st.fault.version : st.weightVersion);
export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
export const isHanging = () => st.fault.mode === "hang";

export function send(res: ServerResponse, status: number, obj: unknown): void {
  const text = JSON.stringify(obj);
  stats.bytesSent += Buffer.byteLength(text);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
  res.end(text);
}

export function take5xx(scope: "generate" | "health"): boolean {
  if (st.fault.mode !== "5xx") return false;
  if (scope === "health" && st.fault.scope !== "all") return false;
  if (st.fault.count === 0) return false;
  if (st.fault.count > 0) st.fault.count--;
  stats.failed5xx++;
  return true;
}

export async function hangWhileFaulted(): Promise<void> {
  const epoch = st.faultEpoch;
  while (isHanging() && st.faultEpoch === epoch) await sleep(20);
}

export type Finish = "stop" | "length" | "abort" | "error_abort" | "error_event";
export interface Generated {
  out: Array<[number, number, null]>;
  top: Array<Array<[number, number, null]>>;
  versions: number[];
  finish: Finish;
  /**
   * The version reported at the end, read before the request leaves the server: tokenizer_manager.py
   * _handle_batch_output puts server_args.weight_version into meta_info while the request still holds
   * the model update lock's reader side, so a load waiting on the writer side cannot change it first.
   */
  endVersion?: number;
}

/** Whether the memory a generation needs is released (weights or KV cache). */
export function isMemoryReleased(): boolean {
  return st.offloadTags.has("weights") || st.offloadTags.has("kv_cache");
}
