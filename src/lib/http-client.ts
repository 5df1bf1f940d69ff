/**
 * rlq's one HTTP client: inference servers (engines/http.ts), remote rewards
 * and HTTP plugins (`postJsonWithRetry`), and the remote trainer
 * (trainer/remote-trainer.ts) all go through `httpRequest`. Each caller names
 * its own error codes; what is retriable is decided here:
 *
 * - a network failure (refused, reset, unreachable host, DNS, a socket closed
 *   mid-answer) and a timeout: retriable (`HttpNetworkError`);
 * - an HTTP status: `isRetriableStatus` (5xx, 408, 429), other 4xx not: the
 *   server refused the request and asking again gives the same answer.
 *
 * The transport is node:http with a keep-alive agent, not fetch: undici's
 * fetch costs several times more CPU per request (WHATWG streams, an AbortSignal
 * and a Request object each), the largest single cost of a rollout job
 * against an instant engine (bench/control-plane.ts measures it). Idle sockets are closed after IDLE_SOCKET_MS, under the 5 s
 * keep-alive of uvicorn (SGLang, vLLM) and Node servers, so a request is not
 * written to a socket the server is closing; if that still happens on a
 * reused socket before any answer, the request is sent once more on a new one.
 */

import http from "node:http";
import https from "node:https";
import { RlqError, type ErrorCode } from "./errors.ts";

export interface HttpCallOptions {
  /** The whole call (connect, send, answer), ms. */
  timeoutMs: number;
  /** Cancels the call (the socket is destroyed, so the server sees the disconnect). */
  signal?: AbortSignal;
  /** Extra request headers (Authorization: Bearer for a server started with --api-key). */
  headers?: Readonly<Record<string, string>>;
  /**
   * A connection not made in this long fails as unreachable (errno ETIMEDOUT), so a host that
   * drops packets is told apart from a server that connected and is slow. Default 10 s (undici's).
   */
  connectTimeoutMs?: number;
  /**
   * "control": a short call that comes in bursts (an engine's abort_request: a weight sync aborts
   * every request in flight at once). Control calls to one server share at most
   * CONTROL_SOCKETS_PER_SERVER kept-alive connections and queue for them, instead of each opening
   * its own (a sync at 64 engines aborts ~1200 requests at once). 1200 concurrent POSTs from one
   * Node process took ~1.2 s unbounded and ~0.2 s over a few connections per server
   * (bench/cluster-sim.ts, docs/performance.md "Cluster scale").
   */
  lane?: "control";
}

export type HttpMethod = "GET" | "POST" | "DELETE";

/** `Authorization: Bearer` for an API key; nothing without one. */
export function bearer(apiKey: string | null | undefined): Record<string, string> | undefined {
  return apiKey ? { authorization: `Bearer ${apiKey}` } : undefined;
}

/** Statuses worth asking again: the server's fault or load (5xx), a request timeout (408), rate limiting (429). */
export function isRetriableStatus(status: number): boolean {
  return status >= 500 || status === 408 || status === 429;
}

/**
 * Backoff before try `attemptIndex + 1` (0-based index of the failed try):
 * `min(firstMs · 2^attemptIndex, maxMs) + jitterMs · u`, u in [0, 1).
 */
export function backoffDelayMs(attemptIndex: number, policy: { firstMs: number; maxMs: number; jitterMs?: number }, u = 0): number {
  return Math.min(policy.firstMs * 2 ** attemptIndex, policy.maxMs) + (policy.jitterMs ?? 0) * u;
}

/**
 * The call never got an answer: `kind` says why. `errno` is the socket error's
 * code (ECONNREFUSED, ECONNRESET, ...) when there is one; the original error is
 * the `cause`. Retriable, except a caller's own cancellation.
 */
export class HttpNetworkError extends RlqError {
  readonly kind: "unreachable" | "timeout" | "cancelled";
  readonly errno: string | null;
  constructor(url: string, kind: HttpNetworkError["kind"], cause: unknown, timeoutMs: number) {
    const errno = (cause as { code?: string }).code ?? (cause as { cause?: { code?: string } }).cause?.code ?? null;
    const detail = kind === "timeout" ? `no answer within ${timeoutMs} ms` : (errno ?? (cause as Error).message);
    super(kind === "timeout" ? "http_timeout" : kind === "cancelled" ? "http_cancelled" : "http_unreachable", `${url}: ${detail}`, { cause });
    this.name = "HttpNetworkError";
    this.kind = kind;
    this.errno = errno;
  }
}

const IDLE_SOCKET_MS = 4_000;
const CONNECT_TIMEOUT_MS = 10_000;
/** Connections per server that control calls share (an abort's round trip is ~1 ms: a few carry a burst). */
export const CONTROL_SOCKETS_PER_SERVER = 4;
let agents: { http: http.Agent; https: https.Agent; controlHttp: http.Agent; controlHttps: https.Agent } | null = null;

function agentFor(u: URL, lane: HttpCallOptions["lane"]): http.Agent {
  agents ??= {
    http: new http.Agent({ keepAlive: true, timeout: IDLE_SOCKET_MS }),
    https: new https.Agent({ keepAlive: true, timeout: IDLE_SOCKET_MS }),
    controlHttp: new http.Agent({ keepAlive: true, timeout: IDLE_SOCKET_MS, maxSockets: CONTROL_SOCKETS_PER_SERVER }),
    controlHttps: new https.Agent({ keepAlive: true, timeout: IDLE_SOCKET_MS, maxSockets: CONTROL_SOCKETS_PER_SERVER }),
  };
  const isHttps = u.protocol === "https:";
  if (lane === "control") return isHttps ? agents.controlHttps : agents.controlHttp;
  return isHttps ? agents.https : agents.http;
}

/** Takes a response body chunk by chunk (decoded); `end` gives the call's result. Throwing from either ends the call with that error. */
export interface BodySink<T> {
  write(chunk: string): void;
  end(): T;
}

/** What `onResponse` learns before the body: the status, its reason phrase and the content type. */
export interface ResponseHead {
  status: number;
  statusText: string;
  contentType: string;
}

/**
 * One request. `onResponse` gets the response head and returns the sink for
 * the body; resolves with the sink's result once the body ended. The timeout
 * covers the whole call; the caller's signal cancels it. Rejects with an
 * RlqError thrown by the sink as it is, anything else as an HttpNetworkError.
 */
export function httpRequest<T>(
  method: HttpMethod,
  url: string,
  body: unknown,
  options: HttpCallOptions,
  onResponse: (head: ResponseHead) => BodySink<T>,
): Promise<T> {
  const u = new URL(url);
  const payload = body === undefined ? undefined : JSON.stringify(body);
  const headers = { ...options.headers };
  const signal = options.signal;
  return new Promise<T>((resolve, reject) => {
    let timedOut = false;
    let isDone = false;
    let current: http.ClientRequest | null = null;
    const finish = (error: unknown, value?: T) => {
      if (isDone) return;
      isDone = true;
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
      if (error === null) resolve(value as T);
      else if (error instanceof RlqError) reject(error);
      else reject(new HttpNetworkError(url, timedOut ? "timeout" : signal?.aborted ? "cancelled" : "unreachable", error, options.timeoutMs));
    };
    const timer = setTimeout(() => {
      timedOut = true;
      current?.destroy(new Error("timeout"));
      finish(new Error("timeout"));
    }, options.timeoutMs);
    timer.unref?.();
    const onAbort = () => {
      const e = Object.assign(new Error("aborted by caller"), { name: "AbortError", code: "ABORT_ERR" });
      current?.destroy(e);
      finish(e);
    };
    if (signal?.aborted) return onAbort();
    signal?.addEventListener("abort", onAbort, { once: true });

    const send = (isRetry: boolean) => {
      let hasAnswer = false;
      const req = (u.protocol === "https:" ? https : http).request(u, {
        method,
        agent: agentFor(u, options.lane),
        headers: payload === undefined ? headers : { ...headers, "content-type": "application/json", "content-length": Buffer.byteLength(payload) },
      });
      current = req;
      req.once("socket", (socket) => {
        if (!socket.connecting) return;
        const t = setTimeout(
          () => req.destroy(Object.assign(new Error("connect timed out"), { code: "ETIMEDOUT" })),
          options.connectTimeoutMs ?? CONNECT_TIMEOUT_MS,
        );
        t.unref?.();
        socket.once("connect", () => clearTimeout(t));
        socket.once("close", () => clearTimeout(t));
      });
      req.on("error", (e: NodeJS.ErrnoException) => {
        // A keep-alive socket the server closed while idle: the request never reached it.
        if (!hasAnswer && !isRetry && !isDone && req.reusedSocket && (e.code === "ECONNRESET" || e.code === "EPIPE")) return send(true);
        finish(e);
      });
      req.on("response", (res) => {
        hasAnswer = true;
        let sink: BodySink<T> | null = null;
        let failed: unknown = null;
        try {
          sink = onResponse({ status: res.statusCode ?? 0, statusText: res.statusMessage ?? "", contentType: String(res.headers["content-type"] ?? "") });
        } catch (e) {
          failed = e;
        }
        res.setEncoding("utf8");
        res.on("data", (chunk: string) => {
          if (failed !== null || sink === null) return;
          try {
            sink.write(chunk);
          } catch (e) {
            failed = e;
            res.destroy();
            finish(e);
          }
        });
        res.on("end", () => {
          if (failed !== null) return finish(failed);
          try {
            finish(null, (sink as BodySink<T>).end());
          } catch (e) {
            finish(e);
          }
        });
        // The connection died mid-body (the server process exited, a reset).
        res.on("error", (e) => finish(e));
        res.on("close", () => {
          if (!res.complete) finish(Object.assign(new Error("socket closed mid-answer"), { code: "ECONNRESET" }));
        });
      });
      req.end(payload);
    };
    send(false);
  });
}

/** A whole answer as text, whatever its status. */
export interface TextAnswer extends ResponseHead {
  text: string;
}

/** One request; resolves with the status and the whole body as text (rejects only with an HttpNetworkError). */
export function requestText(method: HttpMethod, url: string, body: unknown, options: HttpCallOptions): Promise<TextAnswer> {
  return httpRequest(method, url, body, options, (head) => {
    let text = "";
    return {
      write: (chunk) => void (text += chunk),
      end: () => ({ ...head, text }),
    };
  });
}

/**
 * Retries (slime's `remote_rm` policy, also HTTP plugins'): up to
 * `maxAttempts` (10) tries, sleeping `min(2^a, 30) + U(0, 1)` s after failed
 * try `a` (0-based), while the whole call stays within `totalTimeoutMs`.
 * Retried: network errors, timeouts, `isRetriableStatus`, and a body that is
 * not JSON (a proxy's HTML error page or a half-written body: transient more
 * often than not). Not retried: other 4xx.
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

/** A retried POST gave up; `record` says what happened last. */
export class RemoteCallError extends RlqError {
  readonly record: RemoteFailureRecord;
  constructor(code: ErrorCode, message: string, record: RemoteFailureRecord, isRetriable: boolean) {
    super(code, message, { isRetriable });
    this.name = "RemoteCallError";
    this.record = record;
  }
}

const EXCERPT_CHARS = 500;
const SLIME_BACKOFF = { firstMs: 1000, maxMs: 30_000, jitterMs: 1000 };
const defaultSleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** slime's backoff after failed try `a` (0-based): min(2^a, 30) + U(0,1) seconds, in ms. */
export function backoffMs(attemptIndex: number, u: number): number {
  return backoffDelayMs(attemptIndex, SLIME_BACKOFF, u);
}

/**
 * POST `body` as JSON to `url` and return the parsed JSON answer, retrying as
 * described at HttpRetryOptions. Once it gives up it throws `RemoteCallError`
 * (`code`, default `remote_call_failed`) with the failure record, or what
 * `makeError` builds from the same.
 */
export async function postJsonWithRetry(
  url: string,
  body: unknown,
  options: HttpRetryOptions & {
    what?: string;
    code?: ErrorCode;
    sampleIndex?: number;
    makeError?: (message: string, record: RemoteFailureRecord, isRetriable: boolean) => Error;
  } = {},
): Promise<unknown> {
  const maxAttempts = options.maxAttempts ?? 10;
  const requestTimeoutMs = options.requestTimeoutMs ?? 120_000;
  const totalTimeoutMs = options.totalTimeoutMs ?? 600_000;
  const random = options.random ?? Math.random;
  const sleep = options.sleep ?? defaultSleep;
  const started = Date.now();
  let last: AttemptFailure | null = null;
  let attempt = 0;
  while (attempt < maxAttempts) {
    attempt++;
    const remaining = totalTimeoutMs - (Date.now() - started);
    const failure = await tryOnce(url, body, Math.max(1, Math.min(requestTimeoutMs, remaining)), options.headers, attempt);
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
  if (options.makeError) throw options.makeError(message, record, f.isRetriable);
  throw new RemoteCallError(options.code ?? "remote_call_failed", message, record, f.isRetriable);
}

type TryResult = { ok: true; value: unknown } | { ok: false; failure: AttemptFailure };

async function tryOnce(url: string, body: unknown, timeoutMs: number, headers: Record<string, string> | undefined, attempt: number): Promise<TryResult> {
  const fail = (status: number | null, bodyExcerpt: string | null, error: string, isRetriable: boolean): TryResult => ({
    ok: false,
    failure: { url, attempt, status, bodyExcerpt, error, isRetriable },
  });
  let res: TextAnswer;
  try {
    res = await requestText("POST", url, body, { timeoutMs, headers: { accept: "application/json", ...headers } });
  } catch (e) {
    const err = e as HttpNetworkError;
    const cause = err.cause as Error | undefined;
    const detail = err.kind === "timeout" ? `timed out after ${timeoutMs} ms` : `${cause?.message ?? err.message}${err.errno ? ` (${err.errno})` : ""}`;
    return fail(null, null, detail, true);
  }
  const text = res.text;
  const excerpt = text.length > EXCERPT_CHARS ? `${text.slice(0, EXCERPT_CHARS)}…` : text;
  if (res.status < 200 || res.status >= 300) return fail(res.status, excerpt, `status ${res.status} ${res.statusText}`.trim(), isRetriableStatus(res.status));
  try {
    return { ok: true, value: JSON.parse(text) as unknown };
  } catch {
    return fail(res.status, excerpt, "the body is not JSON", true);
  }
}
