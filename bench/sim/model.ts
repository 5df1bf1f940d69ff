/**
 * The simulated cluster's model (bench/cluster-sim.ts): SGLang engines as timers, a trainer whose
 * step time scales with tokens, response lengths from a capped lognormal, and the ideal pipeline
 * computed from the same model. No CPU per token: an engine is a fluid model of continuous batching.
 *
 * Units: "sim ms" are milliseconds of the simulated cluster; the farm and the trainer run them
 * `timeScale` times faster on the wall clock. "Real tokens" are the simulated model's tokens; rlq
 * sees one token per `tokenScale` real tokens (so a 16k-token response is 16k/tokenScale token ids
 * through rlq), which keeps the box's CPU for rlq instead of for JSON.
 */

export interface SimParams {
  /** Engine decode: one continuous-batching iteration with b decoding requests takes itl0 + itlPerReq·b sim ms, one token each. */
  itl0Ms: number;
  itlPerReqMs: number;
  /** Most requests an engine runs at once (SGLang --max-running-requests); the rest wait, FIFO. */
  maxRunning: number;
  /** Prefill: prefill0 + prefillPerToken · input real tokens, before the request decodes (it holds a slot). */
  prefill0Ms: number;
  prefillPerTokenMs: number;
  /** Real tokens of every prompt. */
  promptTokens: number;
  /** update_weights_from_disk: sim ms once the engine has no request running. */
  weightLoadMs: number;
  /** Response length in real tokens: lognormal(mu, sigma), capped. */
  lenMu: number;
  lenSigma: number;
  lenCap: number;
  /** Trainer: a step takes train0 + tokens / trainTokensPerS sim s (tokens: real, every sample's response). */
  train0Ms: number;
  trainTokensPerS: number;
  /** A reward's fixed cost, sim ms. */
  rewardMs: number;
  /** Sim ms per wall ms. */
  timeScale: number;
  /** Real tokens per token id rlq sees. */
  tokenScale: number;
}

/** Sources of the defaults, kept with them in the result JSON. */
export const paramSources: Record<string, string> = {
  model: "an 8B dense model (Llama-3.1-8B class) in bf16, one H100 80GB per engine, TP 1",
  itl:
    "iteration time itl0 + itlPerReq*b: itl0 = 7 ms, above the HBM bound for 16 GB of weights at 3.35 TB/s (4.8 ms); itlPerReq fits " +
    "SGLang's offline output throughput of 16,215 tok/s for Llama-3.1-8B-Instruct bf16 on one H100 (research.aimultiple.com/inference-engines, " +
    "1000 ShareGPT prompts) at b = 256: 256/16215 s = 15.8 ms per iteration, so (15.8 - 7)/255 = 0.0345 ms per request",
  maxRunning:
    "16 per simulated engine, not SGLang's ~256 on an H100: rlq holds every in-flight sample as a BullMQ job and an HTTP request on a 2-core box; " +
    "each simulated engine is a 16-slot slice with the H100's per-request speed at that batch",
  prefill:
    "5 ms + 0.05 ms per input token (about 20k prefill tok/s for an 8B model on an H100; assumption); no prefix cache after a weight load, so a resumed segment prefills its whole prefix",
  weightLoad:
    "4 s: 16 GB of bf16 safetensors through update_weights_from_disk from the page cache (assumption, ~4 GB/s); SGLang holds new requests and waits for running ones (the model update lock)",
  length: "lognormal, median exp(mu) = 1024 real tokens, sigma 1.0 (mean ~1690), capped at 16384: a long-tailed reasoning workload",
  trainer:
    "2 s fixed (optimizer step, checkpoint write) + tokens / (trainer GPUs = engines) / 5000 tok/s per GPU: 8B training with the old-logprob pass is ~80 GFLOP per token, " +
    "an H100 at 40% MFU of 990 TFLOP/s gives ~5000 tok/s (assumption)",
  reward: "50 ms fixed per sample (a rule-based or small remote reward)",
};

export function defaultParams(engines: number): SimParams {
  return {
    itl0Ms: 7,
    itlPerReqMs: 0.0345,
    maxRunning: 16,
    prefill0Ms: 5,
    prefillPerTokenMs: 0.05,
    promptTokens: 512,
    weightLoadMs: 4000,
    lenMu: Math.log(1024),
    lenSigma: 1.0,
    lenCap: 16384,
    train0Ms: 2000,
    trainTokensPerS: 5000 * engines,
    rewardMs: 50,
    timeScale: 1,
    tokenScale: 16,
  };
}

/** FNV-1a over a string, then two uniforms in (0,1) from it and a second round. */
function hash32(s: string, seed: number): number {
  let h = 0x811c9dc5 ^ seed;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  return h >>> 0;
}

/** The response length in real tokens of one sample (a deterministic function of its key). */
export function responseLength(key: string, p: Pick<SimParams, "lenMu" | "lenSigma" | "lenCap">): number {
  const u1 = (hash32(key, 1) + 0.5) / 2 ** 32;
  const u2 = (hash32(key, 2) + 0.5) / 2 ** 32;
  const z = Math.sqrt(-2 * Math.log(u1)) * Math.cos(2 * Math.PI * u2);
  return Math.max(1, Math.min(p.lenCap, Math.round(Math.exp(p.lenMu + p.lenSigma * z))));
}

/** erf, Abramowitz and Stegun 7.1.26 (|error| < 1.5e-7). */
function erf(x: number): number {
  const s = Math.sign(x);
  const a = Math.abs(x);
  const t = 1 / (1 + 0.3275911 * a);
  const y = 1 - ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * Math.exp(-a * a);
  return s * y;
}
const phi = (x: number) => 0.5 * (1 + erf(x / Math.SQRT2));

/** E[min(L, cap)] for L ~ lognormal(mu, sigma). */
export function meanCappedLength(p: Pick<SimParams, "lenMu" | "lenSigma" | "lenCap">): number {
  const { lenMu: mu, lenSigma: s, lenCap: cap } = p;
  const lc = Math.log(cap);
  return Math.exp(mu + (s * s) / 2) * phi((lc - mu - s * s) / s) + cap * (1 - phi((lc - mu) / s));
}

export const iterationMs = (p: SimParams, b: number) => p.itl0Ms + p.itlPerReqMs * b;

/**
 * The ideal: a perfect pipeline with the same engine and trainer model. Every engine runs
 * maxRunning requests at all times (no tail, no idle slot, no control-plane delay), pays its weight
 * load once per step, and the trainer trains step s while the engines generate step s+1
 * (pipelined), or after them (sequential: the best a synchronous loop can do with perfect packing).
 * Everything in sim units; samplesPerS etc. are per sim second.
 */
export function idealPipeline(p: SimParams, engines: number, samplesPerStep: number) {
  const meanLen = meanCappedLength(p);
  const slotMsPerSample = p.prefill0Ms + p.prefillPerTokenMs * p.promptTokens + meanLen * iterationMs(p, p.maxRunning);
  const genMs = (samplesPerStep * slotMsPerSample) / (engines * p.maxRunning) + p.weightLoadMs;
  const trainMs = p.train0Ms + (1000 * samplesPerStep * meanLen) / p.trainTokensPerS;
  const pipelinedMs = Math.max(genMs, trainMs);
  const sequentialMs = genMs + trainMs;
  return {
    meanResponseTokens: meanLen,
    slotMsPerSample,
    engineTokensPerSAtFullBatch: (1000 * p.maxRunning) / iterationMs(p, p.maxRunning),
    generateMsPerStep: genMs,
    trainMsPerStep: trainMs,
    pipelined: {
      stepMs: pipelinedMs,
      samplesPerS: (1000 * samplesPerStep) / pipelinedMs,
      tokensPerS: (1000 * samplesPerStep * meanLen) / pipelinedMs,
      engineBusy: genMs / pipelinedMs,
      trainerBusy: trainMs / pipelinedMs,
    },
    sequential: {
      stepMs: sequentialMs,
      samplesPerS: (1000 * samplesPerStep) / sequentialMs,
      tokensPerS: (1000 * samplesPerStep * meanLen) / sequentialMs,
      engineBusy: genMs / sequentialMs,
      trainerBusy: trainMs / sequentialMs,
    },
  };
}

/** A clock in sim ms with one-shot timers: the wall clock scaled (the farm), or a virtual one (tests). */
export interface SimClock {
  now(): number;
  at(t: number, fn: () => void): { cancel(): void };
}

export function wallClock(timeScale: number): SimClock & { wallAt(simMs: number): number; lateness: { count: number; sumMs: number; maxMs: number } } {
  const t0 = performance.now();
  const e0 = Date.now();
  // How late timers fire on this box (wall ms): a loaded machine stretches the simulated engines.
  const lateness = { count: 0, sumMs: 0, maxMs: 0 };
  return {
    lateness,
    now: () => (performance.now() - t0) * timeScale,
    at(t, fn) {
      const dueWall = t0 + t / timeScale;
      const h = setTimeout(
        () => {
          const late = Math.max(0, performance.now() - dueWall);
          lateness.count++;
          lateness.sumMs += late;
          lateness.maxMs = Math.max(lateness.maxMs, late);
          fn();
        },
        Math.max(0, dueWall - performance.now()),
      );
      return { cancel: () => clearTimeout(h) };
    },
    /** Epoch ms of a sim time, to compare with Postgres timestamps. */
    wallAt: (simMs: number) => e0 + simMs / timeScale,
  };
}

export interface SimRequest {
  rid: string;
  /** Real tokens to generate before this request ends (its budget or its sample's end, whichever first). */
  target: number;
  inputTokens: number;
  /**
   * `spans`: the versions its tokens were made at, [version, startRealToken, endRealToken), oldest
   * first; more than one only for a request that outlived an in-place load.
   */
  onDone(producedRealTokens: number, isAborted: boolean, version: number, spans: Array<[number, number, number]>): void;
}

interface Live extends SimRequest {
  produced: number;
  /** Where each version began (real tokens produced then): [version, from]. */
  versionsFrom: Array<[number, number]>;
  decodeFrom: number;
  /** Held behind a load when its client went away: it ends when the load releases it. */
  isGone?: boolean;
}

/**
 * One SGLang engine as a fluid model of continuous batching: between events, each decoding request
 * gains 1/iterationMs(b) tokens per sim ms, where b is the number decoding. Events: a prefill ends,
 * a request reaches its target, a request arrives, is aborted, or a weight load starts or ends.
 */
export class SimEngine {
  version = 0;
  private running = new Map<string, Live>();
  private waiting: Live[] = [];
  private held: Live[] = [];
  private loading: { version: number; done: () => void } | null = null;
  /**
   * pause_generation {mode: "in_place"} (scheduler.py pause_generation): the running and waiting
   * requests stay, keep their caches and make no tokens; new ones wait; a load from disk starts at
   * once (tokenizer_manager.py update_weights_from_disk skips the model update lock while paused).
   */
  private isPaused = false;
  /** Sim time the model update lock was asked for (the current load, or the first of a chain); null when none is. */
  private lockedSince: number | null = null;
  /** Sim time at which the current version took effect (its load's end; 0 for the first). */
  private versionSince = 0;
  /** Sim time a request last ended (its output reached the tokenizer manager). */
  private lastOutputAt = -Infinity;
  private isLoadTimed = false;
  private last = 0;
  private timer: { cancel(): void } | null = null;
  /** Accounting, sim ms and real tokens. */
  busyMs = 0;
  tokens = 0;
  loadMs = 0;
  /** Sim ms with no request decoding (empty, prefilling only, paused or loading): the engine's idle time. */
  idleMs = 0;
  /** Sum over time of the requests holding a slot (prefilling or decoding), sim ms: occupancy = slotMs / (maxRunning · time). */
  slotMs = 0;
  /** Sim time at which a request first decoded on each version. */
  firstDecodeAt = new Map<number, number>();
  /**
   * Sim time at which the engine first had a request to run on each version: one arrived after the
   * load, or one held through the load was released. From there to `firstDecodeAt` is the engine's
   * own (the model's prefill); before it, the control plane's.
   */
  firstRequestAt = new Map<number, number>();
  /** Sim time at which all `maxRunning` slots first held a request on each version (the refill after a load). */
  firstFullAt = new Map<number, number>();
  loadsAt: Array<{ version: number; askedAt: number; doneAt: number }> = [];

  constructor(
    private readonly p: SimParams,
    private readonly clock: SimClock,
  ) {
    this.last = clock.now();
  }

  /** Requests holding a slot now (prefilling or decoding). */
  get holding(): number {
    return this.running.size;
  }

  /** A load holds (or waits for) the model update lock. */
  get isLoading(): boolean {
    return this.loading !== null;
  }

  get live(): number {
    return this.running.size + this.waiting.length + this.held.length;
  }

  submit(r: SimRequest): void {
    this.advance();
    const l: Live = { ...r, produced: 0, decodeFrom: Infinity, versionsFrom: [] };
    if (this.loading && !this.isPaused) this.held.push(l);
    else {
      this.waiting.push(l);
      this.noteRequest();
    }
    this.settle();
  }

  /**
   * Abort by rid (SGLang abort_request): a running or waiting request ends now with the tokens it has.
   * One held behind a weight load is not in the server's rid_to_state yet, so the abort does nothing
   * (tokenizer_manager.py abort_request returns early for an unknown rid): it runs after the load.
   */
  abort(rid: string): boolean {
    this.advance();
    const r = this.running.get(rid);
    if (r) {
      this.running.delete(rid);
      this.end(r, Math.floor(r.produced), true);
    } else {
      const i = this.waiting.findIndex((x) => x.rid === rid);
      if (i >= 0) {
        const [w] = this.waiting.splice(i, 1);
        if (w) this.end(w, 0, true);
      }
    }
    this.settle();
    return r !== undefined;
  }

  /**
   * abort_all (tokenizer_manager.py abort_request(abort_all=True), scheduler.py abort_request): every
   * running and waiting request ends now with its tokens so far; one held behind a load's model
   * update lock is not in the scheduler and runs after the load.
   */
  abortAll(): void {
    this.advance();
    const ended = [...this.running.values(), ...this.waiting];
    this.running.clear();
    this.waiting = [];
    for (const r of ended) this.end(r, Math.floor(r.produced), true);
    this.settle();
  }

  /**
   * The client of `rid` went away: SGLang aborts the request (tokenizer_manager.py, after a delay the
   * farm does not model); one held behind a load ends when the load releases it, before generating.
   */
  disconnect(rid: string): void {
    const h = this.held.find((x) => x.rid === rid);
    if (h) h.isGone = true;
    else this.abort(rid);
  }

  /**
   * update_weights_from_disk: new requests are held; the ones the server already has (running or
   * waiting: each holds the model update lock's reader side) finish, then the load takes weightLoadMs.
   */
  load(version: number, onLoaded?: () => void): Promise<void> {
    return new Promise((resolve) => {
      this.advance();
      const askedAt = this.clock.now();
      const prev = this.loading;
      const start = () => {
        this.lockedSince ??= this.clock.now();
        this.loading = {
          version,
          done: () => {
            this.loadsAt.push({ version, askedAt, doneAt: this.clock.now() });
            onLoaded?.(); // synchronous, for a virtual clock that runs every timer in one call
            resolve();
          },
        };
        this.isLoadTimed = false;
        this.settle();
      };
      if (prev) {
        const d = prev.done;
        prev.done = () => {
          d();
          start();
        };
      } else start();
    });
  }

  /**
   * Whether anything came out of this engine since sim time `t`, as http_server.py health_generate
   * asks it (tokenizer_manager.last_receive_tstamp > tic): a request ended, or the engine was outside
   * a load's model update lock for a while, so the health check's own one-token generation ran (it
   * waits behind the lock like any request, and the newer scheduler answers it from a running batch).
   */
  hasOutputSince(t: number): boolean {
    return this.lockedSince === null || this.lockedSince > t || this.lastOutputAt >= t;
  }

  private end(r: Live, produced: number, isAborted: boolean): void {
    this.lastOutputAt = this.clock.now();
    const from = r.versionsFrom.length > 0 ? r.versionsFrom : [[this.version, 0] as [number, number]];
    const spans = from
      .map(([v, a], i): [number, number, number] => [v, Math.min(a, produced), Math.min(from[i + 1]?.[1] ?? produced, produced)])
      .filter(([, a, b], i) => b > a || i === from.length - 1);
    r.onDone(produced, isAborted, this.version, spans);
  }

  /** pause_generation in_place: every request stays where it is; nothing decodes until `resume`. */
  pauseInPlace(): void {
    this.advance();
    this.isPaused = true;
    this.settle();
  }

  /** continue_generation: the kept requests go on, at whatever version is loaded now. */
  resume(): void {
    this.advance();
    this.isPaused = false;
    this.settle();
  }

  /** Bring the accounting up to now (no state change). */
  sync(): void {
    this.advance();
  }

  private advance(): void {
    const now = this.clock.now();
    const dt = now - this.last;
    if (dt > 0) {
      if (this.running.size > 0 || (this.loading && this.isLoadTimed)) this.busyMs += dt;
      if (this.loading && this.isLoadTimed) this.loadMs += dt;
      this.slotMs += this.running.size * dt;
      const decoding = this.isPaused ? [] : [...this.running.values()].filter((r) => r.decodeFrom <= this.last);
      if (decoding.length === 0) this.idleMs += dt;
      if (decoding.length > 0) {
        const gain = dt / iterationMs(this.p, decoding.length);
        for (const r of decoding) r.produced += gain;
        this.tokens += gain * decoding.length;
      }
    }
    this.last = now;
  }

  private noteRequest(): void {
    if (!this.firstRequestAt.has(this.version)) this.firstRequestAt.set(this.version, this.clock.now());
  }

  /** The first time a request decoded on the current version (its prefill's end). */
  private noteDecoding(now: number): void {
    if (this.firstDecodeAt.has(this.version)) return;
    let first = Infinity;
    // A request kept through an in-place load decoded before it: on this version it decodes from the load's end.
    for (const r of this.running.values()) if (r.decodeFrom <= now) first = Math.min(first, Math.max(r.decodeFrom, this.versionSince));
    if (first !== Infinity) this.firstDecodeAt.set(this.version, first);
  }

  /** Finish what is due, start what can start, and set the one timer for the next event. */
  private settle(): void {
    const now = this.clock.now();
    this.noteDecoding(now);
    for (const r of [...this.running.values()]) {
      if (r.produced >= r.target - 1e-6) {
        this.running.delete(r.rid);
        this.end(r, r.target, false);
      }
    }
    if (this.loading && (this.isPaused || (this.running.size === 0 && this.waiting.length === 0)) && !this.isLoadTimed) {
      this.isLoadTimed = true;
      const l = this.loading;
      this.timer?.cancel();
      this.timer = this.clock.at(now + this.p.weightLoadMs, () => {
        this.advance();
        this.version = l.version;
        this.versionSince = this.clock.now();
        // Requests kept through the load (in place) go on at the new version from here.
        for (const r of [...this.running.values(), ...this.waiting]) if (r.versionsFrom.length > 0) r.versionsFrom.push([l.version, r.produced]);
        this.loading = null;
        this.isLoadTimed = false;
        this.lockedSince = null;
        for (const h of this.held) {
          if (h.isGone) this.end(h, 0, true);
          else this.waiting.push(h);
        }
        this.held = [];
        if (this.waiting.length > 0) this.noteRequest();
        l.done();
        this.settle();
      });
      return;
    }
    if (this.loading && this.isLoadTimed) return; // the load's timer is the next event
    if (this.isPaused) {
      this.timer?.cancel();
      this.timer = null;
      return;
    }
    while (this.running.size < this.p.maxRunning && this.waiting.length > 0) {
      const r = this.waiting.shift() as Live;
      r.versionsFrom = [[this.version, 0]];
      r.decodeFrom = now + this.p.prefill0Ms + this.p.prefillPerTokenMs * r.inputTokens;
      this.running.set(r.rid, r);
    }
    this.noteDecoding(now);
    if (this.running.size >= this.p.maxRunning && !this.firstFullAt.has(this.version)) this.firstFullAt.set(this.version, now);
    this.timer?.cancel();
    this.timer = null;
    if (this.running.size === 0) return;
    const decodingNow = [...this.running.values()].filter((r) => r.decodeFrom <= now).length;
    let next = Infinity;
    for (const r of this.running.values()) {
      if (r.decodeFrom > now) next = Math.min(next, r.decodeFrom);
      else next = Math.min(next, now + (r.target - r.produced) * iterationMs(this.p, decodingNow));
    }
    this.timer = this.clock.at(next, () => {
      this.advance();
      this.settle();
    });
  }
}
