import { RlqError } from "../lib/errors.ts";

/**
 * The one place where HTTP failures of inference servers become RlqErrors
 * (codes below), so that the pool and the processor edge decide retries from
 * `code`/`isRetriable` and never from message text.
 *
 * - engine_unreachable: connection refused/reset, DNS, socket closed (retriable)
 * - engine_timeout: no answer within the request's timeout (retriable)
 * - engine_http_error: non-2xx; retriable for 5xx and 429
 * - engine_bad_response: not JSON or not the expected shape (retriable: a
 *   restarting server can answer garbage; a persistent one shows up in metrics)
 */
export interface HttpCallOptions {
  timeoutMs: number;
  /** Cancels the call (the pool's local abort); the caller decides what that means. */
  signal?: AbortSignal;
}

export class EngineHttpError extends RlqError {
  readonly status: number | null;
  constructor(code: string, message: string, options: { cause?: unknown; isRetriable: boolean; status?: number | null }) {
    super(code, message, { cause: options.cause, isRetriable: options.isRetriable });
    this.status = options.status ?? null;
  }
}

function linkedSignal(options: HttpCallOptions): { signal: AbortSignal; isTimedOut(): boolean; dispose(): void } {
  const controller = new AbortController();
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    controller.abort(new Error("timeout"));
  }, options.timeoutMs);
  timer.unref?.();
  const onAbort = () => controller.abort(options.signal?.reason);
  if (options.signal?.aborted) controller.abort(options.signal.reason);
  else options.signal?.addEventListener("abort", onAbort, { once: true });
  return {
    signal: controller.signal,
    isTimedOut: () => timedOut,
    dispose: () => {
      clearTimeout(timer);
      options.signal?.removeEventListener("abort", onAbort);
    },
  };
}

/** True when the error is the caller's own cancellation (not a timeout, not a network fault). */
export function isLocalCancel(error: unknown, signal: AbortSignal | undefined): boolean {
  return signal?.aborted === true && !(error instanceof EngineHttpError && error.code === "engine_timeout");
}

function networkError(url: string, e: unknown, timedOut: boolean): EngineHttpError {
  if (timedOut) return new EngineHttpError("engine_timeout", `${url}: no answer in time`, { cause: e, isRetriable: true });
  const cause = (e as { cause?: { code?: string } }).cause;
  const detail = cause?.code ?? (e as Error).message;
  return new EngineHttpError("engine_unreachable", `${url}: ${detail}`, { cause: e, isRetriable: true });
}

async function failOnStatus(url: string, res: Response): Promise<void> {
  if (res.ok) return;
  const text = await res.text().catch(() => "");
  throw new EngineHttpError("engine_http_error", `${url}: HTTP ${res.status}: ${text.slice(0, 300)}`, {
    isRetriable: res.status >= 500 || res.status === 429,
    status: res.status,
  });
}

/** GET or POST a JSON body; resolves with the parsed JSON answer ({} for an empty body). */
export async function callJson(method: "GET" | "POST" | "DELETE", url: string, body: unknown, options: HttpCallOptions): Promise<unknown> {
  const link = linkedSignal(options);
  try {
    let res: Response;
    try {
      res = await fetch(url, {
        method,
        headers: body === undefined ? {} : { "content-type": "application/json" },
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: link.signal,
      });
    } catch (e) {
      throw networkError(url, e, link.isTimedOut());
    }
    await failOnStatus(url, res);
    let text: string;
    try {
      text = await res.text();
    } catch (e) {
      throw networkError(url, e, link.isTimedOut());
    }
    if (text.length === 0) return {};
    try {
      return JSON.parse(text) as unknown;
    } catch (e) {
      throw new EngineHttpError("engine_bad_response", `${url}: response is not JSON: ${text.slice(0, 200)}`, { cause: e, isRetriable: true });
    }
  } finally {
    link.dispose();
  }
}

/**
 * POST a JSON body and consume a server-sent-event stream: `onData` gets each
 * `data:` payload parsed as JSON, in order; `[DONE]` ends the stream. A
 * non-streaming answer (application/json) is handed to `onData` once, so a
 * server that ignores `stream: true` still works. Rejects with an
 * EngineHttpError on network faults, timeouts and cancellation.
 */
export async function postStream(url: string, body: unknown, options: HttpCallOptions, onData: (payload: unknown) => void): Promise<void> {
  const link = linkedSignal(options);
  try {
    let res: Response;
    try {
      res = await fetch(url, {
        method: "POST",
        headers: { "content-type": "application/json", accept: "text/event-stream" },
        body: JSON.stringify(body),
        signal: link.signal,
      });
    } catch (e) {
      throw networkError(url, e, link.isTimedOut());
    }
    await failOnStatus(url, res);
    const isEventStream = (res.headers.get("content-type") ?? "").includes("text/event-stream");
    if (!isEventStream || !res.body) {
      const text = await res.text().catch((e: unknown) => {
        throw networkError(url, e, link.isTimedOut());
      });
      try {
        onData(JSON.parse(text) as unknown);
      } catch (e) {
        if (e instanceof RlqError) throw e;
        throw new EngineHttpError("engine_bad_response", `${url}: response is not JSON: ${text.slice(0, 200)}`, { cause: e, isRetriable: true });
      }
      return;
    }
    const decoder = new TextDecoder();
    let buffer = "";
    try {
      for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
        buffer += decoder.decode(chunk, { stream: true });
        let nl: number;
        while ((nl = buffer.indexOf("\n")) >= 0) {
          const line = buffer.slice(0, nl).replace(/\r$/, "");
          buffer = buffer.slice(nl + 1);
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") return;
          if (data.length === 0) continue;
          let payload: unknown;
          try {
            payload = JSON.parse(data) as unknown;
          } catch (e) {
            throw new EngineHttpError("engine_bad_response", `${url}: stream event is not JSON: ${data.slice(0, 200)}`, { cause: e, isRetriable: true });
          }
          onData(payload);
        }
      }
    } catch (e) {
      if (e instanceof RlqError) throw e;
      throw networkError(url, e, link.isTimedOut());
    }
  } finally {
    link.dispose();
  }
}
