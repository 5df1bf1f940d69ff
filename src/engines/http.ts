/**
 * The one place where HTTP failures of inference servers become RlqErrors
 * (the transport is lib/http-client.ts, rlq's one HTTP client)
 * (codes below), so that the pool and the processor edge decide retries from
 * `code`/`isRetriable` and never from message text.
 *
 * - engine_unreachable: connection refused/reset, DNS, socket closed (retriable)
 * - engine_timeout: no answer within the request's timeout (retriable)
 * - engine_http_error: non-2xx; retriable as lib/http-client.ts's isRetriableStatus (5xx, 408, 429)
 * - engine_bad_response: not JSON or not the expected shape (retriable: a
 *   restarting server can answer garbage; a persistent one shows up in metrics)
 */

import { RlqError, type ErrorCode } from "../lib/errors.ts";
import { httpRequest, HttpNetworkError, isRetriableStatus, type BodySink, type HttpCallOptions } from "../lib/http-client.ts";

export { bearer, type HttpCallOptions } from "../lib/http-client.ts";

export class EngineHttpError extends RlqError {
  readonly status: number | null;
  constructor(code: ErrorCode, message: string, options: { cause?: unknown; isRetriable: boolean; status?: number | null }) {
    super(code, message, { cause: options.cause, isRetriable: options.isRetriable });
    this.status = options.status ?? null;
  }
}

/** True when the error is the caller's own cancellation (not a timeout, not a network fault). */
export function isLocalCancel(error: unknown, signal: AbortSignal | undefined): boolean {
  return signal?.aborted === true && !(error instanceof EngineHttpError && error.code === "engine_timeout");
}

/** A call that got no answer, in this module's codes. */
function networkError(url: string, e: HttpNetworkError): EngineHttpError {
  if (e.kind === "timeout") return new EngineHttpError("engine_timeout", `${url}: no answer in time`, { cause: e.cause, isRetriable: true });
  return new EngineHttpError("engine_unreachable", `${url}: ${e.errno ?? (e.cause as Error).message}`, { cause: e.cause, isRetriable: true });
}

/** `httpRequest` with this module's errors: a network failure becomes engine_unreachable or engine_timeout. */
function request<T>(...args: Parameters<typeof httpRequest<T>>): Promise<T> {
  return httpRequest(...args).catch((e: unknown) => {
    throw e instanceof HttpNetworkError ? networkError(args[1], e) : e;
  });
}

/**
 * What the server said went wrong: the message of an OpenAI-style error body
 * (`{"error": {"message", "type", "param", "code"}}`, vLLM's ErrorResponse), a bare
 * `{"error": "..."}`, FastAPI's `{"detail": "..."}`, else the body as it came. The message is
 * what names the fault (vLLM's over-long prompt: "This model's maximum context length is 128
 * tokens. However, your prompt contains 147 input tokens, ..."); the JSON around it only
 * pushes it past the cut.
 */
export function serverMessage(text: string): string {
  let body: unknown;
  try {
    body = JSON.parse(text) as unknown;
  } catch {
    return text; // not JSON: the text is the message
  }
  if (typeof body !== "object" || body === null) return text;
  const { error, detail, message } = body as { error?: unknown; detail?: unknown; message?: unknown };
  if (typeof error === "object" && error !== null && typeof (error as { message?: unknown }).message === "string") {
    const e = error as { message: string; type?: unknown; param?: unknown };
    const kind = [typeof e.type === "string" ? e.type : null, typeof e.param === "string" ? `param ${e.param}` : null].filter((x) => x !== null).join(", ");
    return kind === "" ? e.message : `${e.message} [${kind}]`;
  }
  if (typeof error === "string") return error;
  if (typeof detail === "string") return detail;
  if (typeof message === "string") return message;
  return text;
}

function statusError(url: string, status: number, text: string): EngineHttpError {
  if (status === 401 || status === 403) {
    return new EngineHttpError(
      "engine_unauthorized",
      `${url}: HTTP ${status}: the server wants an API key (it was started with --api-key): set engine.api_key to {env: NAME} or {file: PATH} in the run config`,
      { isRetriable: false, status },
    );
  }
  return new EngineHttpError("engine_http_error", `${url}: HTTP ${status}: ${serverMessage(text).slice(0, 500)}`, {
    isRetriable: isRetriableStatus(status),
    status,
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
  const text = await request(method, url, body, options, ({ status }) => textSink(url, status));
  if (text.length === 0) return {};
  try {
    return JSON.parse(text) as unknown;
  } catch (e) {
    throw new EngineHttpError("engine_bad_response", `${url}: response is not JSON: ${text.slice(0, 200)}`, { cause: e, isRetriable: true });
  }
}

/** As callJson, for a route whose 2xx answer is plain text (vLLM's /v1/load_lora_adapter: "Success: ..."); returns the text. */
export async function callText(method: "GET" | "POST" | "DELETE", url: string, body: unknown, options: HttpCallOptions): Promise<string> {
  return request(method, url, body, options, ({ status }) => textSink(url, status));
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
  await request("POST", url, body, { ...options, headers }, ({ status, contentType }): BodySink<void> => {
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
