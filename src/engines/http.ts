import http from "node:http";
import https from "node:https";
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
  /** Extra request headers (Authorization: Bearer for a server started with --api-key). */
  headers?: Readonly<Record<string, string>>;
}

/** The headers a server started with --api-key wants (SGLang, vLLM, the SGLang router). */
export function bearer(apiKey: string | undefined): Record<string, string> | undefined {
  return apiKey === undefined ? undefined : { authorization: `Bearer ${apiKey}` };
}

export class EngineHttpError extends RlqError {
  readonly status: number | null;
  constructor(code: string, message: string, options: { cause?: unknown; isRetriable: boolean; status?: number | null }) {
    super(code, message, { cause: options.cause, isRetriable: options.isRetriable });
    this.status = options.status ?? null;
  }
}

/**
 * The transport is node:http with a keep-alive agent, not fetch: undici's
 * fetch costs about 4x more CPU per request (WHATWG streams, an AbortSignal
 * and a Request object each), which was the largest single cost of a rollout
 * job against an instant engine (bench/control-plane.ts; measured with the
 * same server: 2048 small POSTs, ~1.8 s of CPU with fetch, ~0.4 s with
 * node:http). Idle sockets are closed after IDLE_SOCKET_MS, under the 5 s
 * keep-alive of uvicorn (SGLang, vLLM) and Node servers, so a request is not
 * written to a socket the server is closing; if that still happens on a
 * reused socket before any answer, the request is sent once more on a new one.
 */
const IDLE_SOCKET_MS = 4_000;
let agents: { http: http.Agent; https: https.Agent } | null = null;

function agentFor(u: URL): http.Agent {
  agents ??= {
    http: new http.Agent({ keepAlive: true, timeout: IDLE_SOCKET_MS }),
    https: new https.Agent({ keepAlive: true, timeout: IDLE_SOCKET_MS }),
  };
  return u.protocol === "https:" ? agents.https : agents.http;
}

/** True when the error is the caller's own cancellation (not a timeout, not a network fault). */
export function isLocalCancel(error: unknown, signal: AbortSignal | undefined): boolean {
  return signal?.aborted === true && !(error instanceof EngineHttpError && error.code === "engine_timeout");
}

function networkError(url: string, e: unknown, timedOut: boolean): EngineHttpError {
  if (timedOut) return new EngineHttpError("engine_timeout", `${url}: no answer in time`, { cause: e, isRetriable: true });
  const code = (e as { code?: string }).code ?? (e as { cause?: { code?: string } }).cause?.code;
  const detail = code ?? (e as Error).message;
  return new EngineHttpError("engine_unreachable", `${url}: ${detail}`, { cause: e, isRetriable: true });
}

function statusError(url: string, status: number, text: string): EngineHttpError {
  if (status === 401 || status === 403) {
    return new EngineHttpError(
      "engine_unauthorized",
      `${url}: HTTP ${status}: the server wants an API key (it was started with --api-key): set engine.api_key to {env: NAME} or {file: PATH} in the run config`,
      { isRetriable: false, status },
    );
  }
  return new EngineHttpError("engine_http_error", `${url}: HTTP ${status}: ${text.slice(0, 300)}`, {
    isRetriable: status >= 500 || status === 429,
    status,
  });
}

/** Takes a response body chunk by chunk (decoded); `end` gives the call's result. Throwing from either ends the call with that error. */
interface BodySink<T> {
  write(chunk: string): void;
  end(): T;
}

/**
 * One request. `onResponse` gets the status and the content type and returns
 * the sink for the body; resolves with the sink's result once the body ended.
 * The timeout covers the whole call; the caller's signal cancels it (the
 * socket is destroyed, so the server sees the disconnect).
 */
function request<T>(
  method: "GET" | "POST" | "DELETE",
  url: string,
  body: unknown,
  headers: Record<string, string>,
  options: HttpCallOptions,
  onResponse: (status: number, contentType: string) => BodySink<T>,
): Promise<T> {
  const u = new URL(url);
  const payload = body === undefined ? undefined : JSON.stringify(body);
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
      else reject(error instanceof RlqError ? error : networkError(url, error, timedOut));
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
        agent: agentFor(u),
        headers: payload === undefined ? headers : { ...headers, "content-type": "application/json", "content-length": Buffer.byteLength(payload) },
      });
      current = req;
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
          sink = onResponse(res.statusCode ?? 0, String(res.headers["content-type"] ?? ""));
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

/** The whole body as text; a non-2xx status becomes an EngineHttpError once the body is in. */
function textSink(url: string, status: number): BodySink<string> {
  let text = "";
  return {
    write(chunk) {
      text += chunk;
    },
    end() {
      if (status < 200 || status >= 300) throw statusError(url, status, text);
      return text;
    },
  };
}

/** GET or POST a JSON body; resolves with the parsed JSON answer ({} for an empty body). */
export async function callJson(method: "GET" | "POST" | "DELETE", url: string, body: unknown, options: HttpCallOptions): Promise<unknown> {
  const text = await request(method, url, body, { ...options.headers }, options, (status) => textSink(url, status));
  if (text.length === 0) return {};
  try {
    return JSON.parse(text) as unknown;
  } catch (e) {
    throw new EngineHttpError("engine_bad_response", `${url}: response is not JSON: ${text.slice(0, 200)}`, { cause: e, isRetriable: true });
  }
}

/**
 * POST a JSON body and consume a server-sent-event stream: `onData` gets each
 * `data:` payload parsed as JSON, in order; `[DONE]` ends the stream. A
 * non-streaming answer (application/json) is handed to `onData` once, so a
 * server that ignores `stream: true` still works. Rejects with an
 * EngineHttpError on network faults, timeouts and cancellation; an RlqError
 * thrown by `onData` ends the request and is passed through.
 */
export async function postStream(url: string, body: unknown, options: HttpCallOptions, onData: (payload: unknown) => void): Promise<void> {
  const headers = { ...options.headers, accept: "text/event-stream" };
  await request("POST", url, body, headers, options, (status, contentType): BodySink<void> => {
    if (status < 200 || status >= 300 || !contentType.includes("text/event-stream")) {
      const text = textSink(url, status);
      return {
        write: (chunk) => text.write(chunk),
        end() {
          const t = text.end();
          try {
            onData(JSON.parse(t) as unknown);
          } catch (e) {
            if (e instanceof RlqError) throw e;
            throw new EngineHttpError("engine_bad_response", `${url}: response is not JSON: ${t.slice(0, 200)}`, { cause: e, isRetriable: true });
          }
        },
      };
    }
    let buffer = "";
    let isDone = false;
    return {
      write(chunk) {
        if (isDone) return;
        buffer += chunk;
        let nl: number;
        while ((nl = buffer.indexOf("\n")) >= 0) {
          const line = buffer.slice(0, nl).replace(/\r$/, "");
          buffer = buffer.slice(nl + 1);
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") {
            // Events after [DONE] are ignored; the body still ends normally, so the socket is reused.
            isDone = true;
            return;
          }
          if (data.length === 0) continue;
          let payload: unknown;
          try {
            payload = JSON.parse(data) as unknown;
          } catch (e) {
            throw new EngineHttpError("engine_bad_response", `${url}: stream event is not JSON: ${data.slice(0, 200)}`, { cause: e, isRetriable: true });
          }
          onData(payload);
        }
      },
      end() {},
    };
  });
}
