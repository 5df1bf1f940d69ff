import type { GenerateRequest, GenerateResult } from "./engine.ts";
import { callJson, EngineHttpError, isLocalCancel } from "./http.ts";
import type { GenerateHooks } from "./remote.ts";
import { RlqError } from "../lib/errors.ts";

export interface BatchItem {
  req: GenerateRequest;
  hooks: GenerateHooks;
  where: string;
  resolve(r: GenerateResult): void;
  reject(e: unknown): void;
  isSettled: boolean;
}

/** Most requests in one batch /generate. */
const MAX_BATCH = 64;

export interface BatcherDeps {
  url: string;
  timeoutMs: number;
  /** false: every request goes alone (the single form), whatever its batchKey. */
  isBatching: boolean;
  headers: Record<string, string> | undefined;
  httpError(e: unknown, item: BatchItem): unknown;
  samplingParams(s: GenerateRequest["sampling"]): Record<string, unknown>;
  finish(item: BatchItem, payload: unknown): GenerateResult;
  aborted(item: BatchItem): GenerateResult;
}

/** Settle an item once: a local cancel, the batch's answer and its failure may all reach it. */
function settle(item: BatchItem, fn: () => void): void {
  if (item.isSettled) return;
  item.isSettled = true;
  fn();
}

/**
 * With `isBatching` (engine.batch_group), non-streaming requests to one server
 * that arrive in the same event-loop turn with the same batchKey (a rollout
 * job sends its group's samples together) go out as ONE
 * SGLang batch /generate: input_ids, rid and sampling_params as lists; the
 * answer is the list of outputs in order. A lone request keeps the single
 * form. Each item stays its own request everywhere else: the pool routes,
 * counts, retries and aborts it by its rid (SGLang aborts one item of a batch
 * by rid and answers it with its tokens so far), so nothing above this adapter
 * changes. A local cancel (the pool giving up on an abort, an engine declared
 * dead) resolves that item at once as an aborted partial; the HTTP request is
 * cancelled when every item of it is. A failed batch fails each item with the
 * same error; the pool retries each, and counts the failure once toward the
 * engine's consecutive errors.
 *
 * Why it is not the default: a batch answers when its slowest item ends, so a
 * finished sample holds its pool slot until then, and one bad item fails the
 * batch. It pays off only against an instant engine, where the per-request
 * HTTP cost was the largest cost of a rollout job after its queries
 * (bench/control-plane.ts). With
 * streaming on, requests stay one per sample: a streamed batch interleaves its
 * items' events, and the per-request stream is what keeps a dying server's
 * tokens.
 */
export class SglangBatcher {
  /** Requests of this event-loop turn, sent by the next `flush`; written by `submit` and `flush` only. */
  private queued: BatchItem[] = [];
  private isScheduled = false;

  constructor(private readonly deps: BatcherDeps) {}

  submit(req: GenerateRequest, hooks: GenerateHooks, where: string): Promise<GenerateResult> {
    return new Promise<GenerateResult>((resolve, reject) => {
      this.queued.push({ req, hooks, where, resolve, reject, isSettled: false });
      if (!this.isScheduled) {
        this.isScheduled = true;
        // After the current turn's microtasks: every sample of a job has reached here by then.
        setImmediate(() => this.flush());
      }
    });
  }

  private flush(): void {
    this.isScheduled = false;
    const all = this.queued;
    this.queued = [];
    // One batch per batchKey (a group), in arrival order; requests without a key batch together.
    // Not batching: each request is its own batch of one, which goes in the single form.
    const byKey = new Map<string, BatchItem[]>();
    for (const item of all) {
      const key = this.deps.isBatching ? (item.req.batchKey ?? "") : item.req.requestId;
      const list = byKey.get(key);
      if (list) list.push(item);
      else byKey.set(key, [item]);
    }
    for (const items of byKey.values()) for (let i = 0; i < items.length; i += MAX_BATCH) void this.send(items.slice(i, i + MAX_BATCH));
  }

  /** One /generate for `items` (the single form for one); every item is settled when this returns. */
  private async send(items: BatchItem[]): Promise<void> {
    const live = items.filter((item) => {
      if (!item.hooks.signal?.aborted) return true;
      settle(item, () => item.resolve(this.deps.aborted(item)));
      return false;
    });
    if (live.length === 0) return;
    const http = new AbortController();
    const detach = this.watchAborts(live, http);
    const one = live.length === 1 ? live[0] : undefined;
    try {
      let answer: unknown;
      try {
        answer = await callJson("POST", `${this.deps.url}/generate`, this.requestBody(live), {
          timeoutMs: this.deps.timeoutMs,
          signal: http.signal,
          headers: this.deps.headers,
        });
      } catch (e) {
        // One invalid item fails the whole batch with 400 (tokenizer_manager.py validates every item
        // before sending any): resend the items one by one, so only the bad one fails.
        if (!one && e instanceof EngineHttpError && e.status === 400) {
          for (const d of detach.splice(0)) d();
          await Promise.all(live.map((item) => this.send([item])));
          return;
        }
        throw e;
      }
      this.settleAnswers(live, one ? [answer] : answer, answer);
    } catch (e) {
      for (const item of live)
        settle(item, () => (isLocalCancel(e, item.hooks.signal) ? item.resolve(this.deps.aborted(item)) : item.reject(this.deps.httpError(e, item))));
    } finally {
      for (const d of detach) d();
    }
  }

  /**
   * A local cancel resolves its item at once as an aborted partial; the HTTP request is cancelled
   * when every item of it is. Returns the listeners' removers.
   */
  private watchAborts(live: readonly BatchItem[], http: AbortController): Array<() => void> {
    const detach: Array<() => void> = [];
    for (const item of live) {
      const signal = item.hooks.signal;
      if (!signal) continue;
      const onAbort = () => {
        settle(item, () => item.resolve(this.deps.aborted(item)));
        if (live.every((x) => x.isSettled)) http.abort();
      };
      signal.addEventListener("abort", onAbort, { once: true });
      detach.push(() => signal.removeEventListener("abort", onAbort));
    }
    return detach;
  }

  /** The /generate body: the single form for one item, lists (io_struct.py GenerateReqInput) for a batch. */
  private requestBody(live: readonly BatchItem[]): Record<string, unknown> {
    const { deps } = this;
    const one = live.length === 1 ? live[0] : undefined;
    return one
      ? {
          rid: one.req.requestId,
          input_ids: one.req.inputIds,
          return_logprob: true,
          stream: false,
          sampling_params: deps.samplingParams(one.req.sampling),
          ...(one.req.imageData?.length ? { image_data: one.req.imageData } : {}),
        }
      : {
          rid: live.map((x) => x.req.requestId),
          input_ids: live.map((x) => x.req.inputIds),
          return_logprob: true,
          stream: false,
          sampling_params: live.map((x) => deps.samplingParams(x.req.sampling)),
          // io_struct.py GenerateReqInput.image_data in a batch: one entry (a list of images) per item.
          ...(live.some((x) => x.req.imageData?.length) ? { image_data: live.map((x) => x.req.imageData ?? []) } : {}),
        };
  }

  /** Each item's output, in order; an answer that is not one output per item fails the batch (retriable). */
  private settleAnswers(live: readonly BatchItem[], outputs: unknown, answer: unknown): void {
    if (!Array.isArray(outputs) || outputs.length !== live.length) {
      throw new RlqError(
        "engine_bad_response",
        `SGLang ${this.deps.url}/generate: a batch of ${live.length} was answered with ${JSON.stringify(answer)?.slice(0, 200)}`,
        { isRetriable: true },
      );
    }
    live.forEach((item, i) =>
      settle(item, () => {
        try {
          item.resolve(this.deps.finish(item, outputs[i]));
        } catch (e) {
          item.reject(e);
        }
      }),
    );
  }
}
