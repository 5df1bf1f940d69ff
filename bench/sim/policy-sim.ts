/**
 * The zero-overhead event simulation (bench/cluster-sim.ts's second ideal): the same engines
 * (SimEngine), lengths, trainer and reward as the bench, the same scheduling policy as rlq's
 * controller (DESIGN §1: over-sampling and the seal, aborts, partial rollouts, AReaL's admission
 * rule, a weight sync that aborts in-flight requests and loads every engine), on a virtual clock,
 * with no control-plane cost at all. What it loses against idealPipeline is the policy's
 * (long tails, group granularity, sync pauses); what rlq loses against it is rlq's.
 */
import { responseLength, SimEngine, type SimClock, type SimParams } from "./model.ts";
import { mayServeAtVersion } from "../../src/core/staggered-load.ts";

/** A virtual clock: timers run in time order in `run()`. */
export function virtualClock(): SimClock & { run(until?: number): void } {
  let now = 0;
  let seq = 0;
  // A binary heap of timers by (t, seq).
  const heap: Array<{ t: number; seq: number; fn: () => void; isLive: boolean }> = [];
  const less = (a: (typeof heap)[number], b: (typeof heap)[number]) => a.t < b.t || (a.t === b.t && a.seq < b.seq);
  const push = (x: (typeof heap)[number]) => {
    heap.push(x);
    let i = heap.length - 1;
    while (i > 0) {
      const j = (i - 1) >> 1;
      if (!less(heap[i] as never, heap[j] as never)) break;
      [heap[i], heap[j]] = [heap[j] as never, heap[i] as never];
      i = j;
    }
  };
  const pop = () => {
    const top = heap[0];
    const last = heap.pop();
    if (heap.length > 0 && last) {
      heap[0] = last;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < heap.length && less(heap[l] as never, heap[m] as never)) m = l;
        if (r < heap.length && less(heap[r] as never, heap[m] as never)) m = r;
        if (m === i) break;
        [heap[i], heap[m]] = [heap[m] as never, heap[i] as never];
        i = m;
      }
    }
    return top;
  };
  return {
    now: () => now,
    at(t, fn) {
      const timer = { t: Math.max(t, now), seq: seq++, fn, isLive: true };
      push(timer);
      return { cancel: () => void (timer.isLive = false) };
    },
    run(until = Infinity) {
      for (;;) {
        while (heap.length > 0 && !(heap[0] as { isLive: boolean }).isLive) pop();
        const next = heap[0];
        if (!next || next.t > until) {
          if (until !== Infinity) now = until;
          return;
        }
        pop();
        now = next.t;
        next.fn();
      }
    },
  };
}

export interface PolicyMode {
  isAsync: boolean;
  /** async: max_staleness. */
  k: number;
  /** sync: partial_rollout. */
  isPartial: boolean;
  /** sync: over_sampling_batch_size / rollout_batch_size. */
  overSampling: number;
  /** rlq's pool (src/engines/pool-routing.ts): a resumed sample goes back to its engine and waits for a slot there. */
  hasAffinity?: boolean;
  /**
   * rlq's pool cap per engine (sglang_server_concurrency): requests beyond it wait in the pool, FIFO,
   * and go to the least-outstanding engine when a slot frees. Unset: every request goes to the engine
   * with the fewest live requests at once (the engine queues it).
   */
  poolCap?: number;
  /**
   * With poolCap: the requests sent to one engine at one instant travel as one batch /generate
   * (src/engines/sglang-batcher.ts SglangBatcher, stream: false), whose answer comes when its last item
   * ends; the pool frees their slots only then (pool.ts runOn).
   */
  isBatchCoupled?: boolean;
  /**
   * What a weight sync does to the requests in flight (weight_update_mode): `abort` (the default)
   * aborts them all and loads every engine at once; `in_place` pauses each engine keeping its
   * requests, loads, and continues them at the new version (their tokens split at the load).
   */
  syncMode?: "abort" | "in_place";
  /**
   * in_place only: at most this many engines load at once (weight_load_max_engines); the rest keep
   * decoding their requests at the old version and take no new ones, and the groups the new version
   * admits go to the engines already loaded (the per-token staleness bound stays exact: a token is
   * never sampled at a version older than its group's admission). Unset: all at once.
   */
  maxLoadingEngines?: number;
  /**
   * Group completion that does not wait on its slowest sample: each group draws this many samples
   * beyond n, and completes with its first n finished; the rest are aborted and dropped. 0: none.
   */
  extraSamplesPerGroup?: number;
}

/** The bench's modes (bench/cluster-sim.ts) as the policies they run. */
export const benchModePolicies = {
  sync_partial_off: { isAsync: false, k: 0, isPartial: false, overSampling: 1.5 },
  sync_partial_on: { isAsync: false, k: 0, isPartial: true, overSampling: 1.5 },
  async_k1: { isAsync: true, k: 1, isPartial: false, overSampling: 1 },
  async_k2: { isAsync: true, k: 2, isPartial: false, overSampling: 1 },
  async_k4: { isAsync: true, k: 4, isPartial: false, overSampling: 1 },
} as const satisfies Record<string, PolicyMode>;

/**
 * The weight-sync and group-completion arms the bench compares on an async mode (bench/cluster-sim.ts
 * --sync-arms), as the policies they run; staggered arms load an eighth of the engines at a time.
 */
export const syncArmNames = ["abort", "in_place", "early", "staggered_early"] as const;
export type SyncArm = (typeof syncArmNames)[number];
export const EARLY_EXTRA_SAMPLES = 2;
export const staggerWidth = (engines: number) => Math.max(1, Math.round(engines / 8));
export function syncArmPolicy(arm: SyncArm, engines: number): Partial<PolicyMode> {
  switch (arm) {
    case "abort":
      return {};
    case "in_place":
      return { syncMode: "in_place" };
    case "early":
      return { extraSamplesPerGroup: EARLY_EXTRA_SAMPLES };
    case "staggered_early":
      return { syncMode: "in_place", maxLoadingEngines: staggerWidth(engines), extraSamplesPerGroup: EARLY_EXTRA_SAMPLES };
  }
}

export type BenchMode = keyof typeof benchModePolicies;

interface Sample {
  key: string;
  total: number;
  done: number;
  isDone: boolean;
  seg: number;
  rid: string | null;
  engine: SimEngine | null;
  home: SimEngine | null;
}
interface Group {
  id: number;
  samples: Sample[];
  isComplete: boolean;
}

/**
 * Simulate `steps` steps; the result is in sim ms, over the same window as the bench (commit 0 to the last steady step).
 *
 * `keyPrefix` picks the response lengths (the draw): sample i of group g is `${keyPrefix}-${g}-${i}`,
 * the key the engine farm reads from rlq's rid (engine-farm.ts runOne), so a run's id as the prefix
 * replays that run's own lengths. Over a short window the draw moves the result a lot (the few long
 * samples, up to 16x the median length, and where they land decide when a step's last group ends):
 * at 8 engines, async k=2, 6 steps, the ratio to the pipeline ideal spans 0.56-0.92 over 31 draws
 * (bench/policy-ideal.ts).
 */
export function simulatePolicy(p: SimParams, engineCount: number, mode: PolicyMode, rbs: number, n: number, steps: number, keyPrefix = "sim") {
  const clock = virtualClock();
  const engines = Array.from({ length: engineCount }, () => new SimEngine(p, clock));
  const cap = Math.ceil(p.lenCap / p.tokenScale);
  let nextGroup = 0;
  const commits: number[] = [];
  let version = 0;
  let isSyncing = false;
  const tokensAt: Array<[number, number]> = [];
  const slotsAt: Array<[number, number]> = [];

  const extra = mode.extraSamplesPerGroup ?? 0;
  const isInPlace = mode.syncMode === "in_place";
  const newGroup = (): Group => {
    const id = nextGroup++;
    return {
      id,
      isComplete: false,
      samples: Array.from({ length: n + extra }, (_, i) => ({
        key: `${keyPrefix}-${id}-${i}`,
        total: Math.ceil(responseLength(`${keyPrefix}-${id}-${i}`, p) / p.tokenScale),
        done: 0,
        isDone: false,
        seg: 0,
        rid: null,
        engine: null,
        home: null,
      })),
    };
  };
  const live = new Set<Group>();
  const isGroupDone = (g: Group) => g.samples.filter((x) => x.isDone).length >= n;
  /** Engines a new request may go to: during a staggered sync, only those on the newest version. */
  const isStaggered = isInPlace && mode.maxLoadingEngines !== undefined;
  /**
   * Engines a new request may go to. During a staggered sync only those on the newest version, and
   * only while they have a free slot (rlq's pool cap), so the first engines loaded are not buried.
   */
  const routable = () =>
    isSyncing && isStaggered ? engines.filter((e) => mayServeAtVersion(e.version, version, mode.k) && !e.isLoading && e.live < p.maxRunning) : engines;
  const flushWaiting = () => {
    const w = waitingForLoad;
    waitingForLoad = [];
    for (const x of w) if (live.has(x.g) && !x.s.isDone && x.s.rid === null) dispatchSample(x.g, x.s);
  };
  let onGroupDone: (g: Group) => void = () => undefined;

  /** Requests that found no engine on the newest version yet (a staggered sync's first load). */
  let waitingForLoad: Array<{ g: Group; s: Sample }> = [];
  const outstanding = new Map<SimEngine, number>(engines.map((e) => [e, 0]));
  const poolQueue: Array<{ g: Group; s: Sample }> = [];
  const openBatch = new Map<SimEngine, { at: number; left: number; size: number }>();
  const pump = () => {
    const cap = mode.poolCap as number;
    while (poolQueue.length > 0) {
      let best: SimEngine | null = null;
      for (const e of routable())
        if ((outstanding.get(e) as number) < cap && (best === null || (outstanding.get(e) as number) < (outstanding.get(best) as number))) best = e;
      if (!best) return;
      const { g, s } = poolQueue.shift() as { g: Group; s: Sample };
      if (s.isDone || s.rid !== null || !live.has(g)) continue;
      sendTo(best, g, s);
    }
  };
  const dispatchSample = (g: Group, s: Sample) => {
    if (mode.poolCap === undefined) {
      const to = routable();
      if (to.length === 0) {
        waitingForLoad.push({ g, s });
        return;
      }
      sendTo(mode.hasAffinity && s.home && to.includes(s.home) ? s.home : to.reduce((best, x) => (x.live < best.live ? x : best)), g, s);
      return;
    }
    poolQueue.push({ g, s });
    pump();
  };
  const sendTo = (e: SimEngine, g: Group, s: Sample) => {
    s.home = e;
    let release = () => undefined as void;
    if (mode.poolCap !== undefined) {
      outstanding.set(e, (outstanding.get(e) as number) + 1);
      if (mode.isBatchCoupled) {
        let b = openBatch.get(e);
        if (!b || b.at !== clock.now()) {
          b = { at: clock.now(), left: 0, size: 0 };
          openBatch.set(e, b);
        }
        const batch = b;
        batch.left++;
        batch.size++;
        release = () => {
          if (--batch.left > 0) return;
          outstanding.set(e, (outstanding.get(e) as number) - batch.size);
          if (openBatch.get(e) === batch) openBatch.delete(e);
          clock.at(clock.now(), pump);
        };
      } else {
        release = () => {
          outstanding.set(e, (outstanding.get(e) as number) - 1);
          clock.at(clock.now(), pump);
        };
      }
    }
    const left = Math.min(s.total, cap) - s.done;
    const rid = `${s.key}-${s.seg++}`;
    s.rid = rid;
    s.engine = e;
    e.submit({
      rid,
      target: left * p.tokenScale,
      inputTokens: p.promptTokens + s.done * p.tokenScale,
      onDone(real, isAborted) {
        s.rid = null;
        s.engine = null;
        release();
        if (waitingForLoad.length > 0) clock.at(clock.now(), flushWaiting);
        if (isAborted) {
          s.done += Math.floor(real / p.tokenScale);
          return;
        }
        s.done += left;
        s.isDone = true;
        if (isGroupDone(g)) {
          // Early completion: the samples still running are aborted and dropped.
          if (extra > 0) for (const x of g.samples) if (!x.isDone && x.rid && x.engine) x.engine.abort(x.rid);
          clock.at(clock.now() + p.rewardMs, () => onGroupDone(g));
        }
      },
    });
  };
  const dispatch = (g: Group) => {
    live.add(g);
    if (!isGroupDone(g)) for (const s of g.samples) if (!s.isDone && s.rid === null) dispatchSample(g, s);
    // A group whose every member finished before it was drained back only waits for its reward.
    if (isGroupDone(g)) clock.at(clock.now() + p.rewardMs, () => onGroupDone(g));
  };
  const abortAll = (filter: (g: Group) => boolean) => {
    for (const g of live) if (filter(g)) for (const s of g.samples) if (s.rid && s.engine) s.engine.abort(s.rid);
  };
  /** Real tokens each trained step trained (the kept samples' responses), in training order: commits[i]'s step. */
  const trainedTokens: number[] = [];
  const tokensOf = (groups: Group[]) =>
    groups.reduce(
      (a, g) =>
        a +
        g.samples
          .filter((s) => s.isDone)
          .slice(0, n)
          .reduce((b, s) => b + s.done * p.tokenScale, 0),
      0,
    );
  const trainMs = (groups: Group[]) => p.train0Ms + (1000 * tokensOf(groups)) / p.trainTokensPerS;
  const syncWeights = (then: () => void, onEngineLoaded: () => void = () => undefined) => {
    isSyncing = true;
    version++;
    let left = engines.length;
    const queue = [...engines];
    const loadNext = () => {
      const e = queue.shift();
      if (!e) return;
      if (isInPlace) e.pauseInPlace();
      void e.load(version, () => {
        if (isInPlace) e.resume();
        onEngineLoaded();
        if (--left === 0) {
          isSyncing = false;
          then();
          return;
        }
        loadNext();
      });
    };
    const atOnce = isInPlace ? Math.min(engines.length, mode.maxLoadingEngines ?? engines.length) : engines.length;
    for (let i = 0; i < atOnce; i++) loadNext();
  };
  let trainerBusyMs = 0;

  if (!mode.isAsync) {
    let buffer: Group[] = [];
    const step = (s: number) => {
      if (s >= steps) return;
      const drawn: Group[] = [];
      const want = Math.ceil(rbs * mode.overSampling);
      while (drawn.length < want) drawn.push(buffer.shift() ?? newGroup());
      const kept: Group[] = [];
      let isSealed = false;
      onGroupDone = (g) => {
        if (isSealed || !live.has(g) || g.isComplete) return;
        g.isComplete = true;
        live.delete(g);
        kept.push(g);
        if (kept.length < rbs) return;
        isSealed = true;
        const rest = [...live];
        abortAll(() => true);
        live.clear();
        buffer = mode.isPartial ? [...buffer, ...rest] : buffer;
        const t = trainMs(kept);
        trainerBusyMs += t;
        trainedTokens.push(tokensOf(kept));
        clock.at(clock.now() + t, () => {
          commits.push(clock.now());
          syncWeights(() => step(s + 1));
        });
      };
      for (const g of drawn) dispatch(g);
    };
    step(0);
  } else {
    let accepted = 0;
    let running = 0;
    let drawnGroups = 0;
    const batch: Group[] = [];
    const sealed: Group[][] = [];
    let isTraining = false;
    const admit = () => {
      if (isSyncing && !isStaggered) return;
      while (accepted + running < (mode.k + version + 1) * rbs && drawnGroups < steps * rbs) {
        drawnGroups++;
        running++;
        dispatch(newGroup());
      }
    };
    // A commit that came while a staggered sync was still loading: its sync starts when that one ends.
    let deferredSync: (() => void) | null = null;
    const train = () => {
      // rlq's controller trains the next sealed step while a sync runs (async-pipeline.ts trainAsync);
      // the abort-mode model keeps the trainer waiting for the sync, as the policy ideal always has.
      if (isTraining || (isSyncing && !isStaggered) || sealed.length === 0) return;
      const groups = sealed.shift() as Group[];
      isTraining = true;
      const t = trainMs(groups);
      trainerBusyMs += t;
      trainedTokens.push(tokensOf(groups));
      clock.at(clock.now() + t, () => {
        isTraining = false;
        commits.push(clock.now());
        if (isInPlace) {
          // In place: nothing is aborted; each engine's requests wait for its own load. Staggered, the
          // new version admits its groups as soon as one engine has loaded it.
          const sync = () =>
            syncWeights(
              () => {
                flushWaiting();
                admit();
                const next = deferredSync;
                deferredSync = null;
                next?.();
                train();
              },
              () => {
                flushWaiting();
                if (isStaggered) admit();
              },
            );
          if (isSyncing) deferredSync = sync;
          else sync();
          train();
          return;
        }
        // Sync: abort the in-flight requests (they resume after the load), load every engine.
        const pending = [...live];
        abortAll(() => true);
        syncWeights(() => {
          for (const g of pending) if (live.has(g)) dispatch(g);
          admit();
          train();
        });
      });
    };
    onGroupDone = (g) => {
      if (g.isComplete || !live.has(g)) return;
      g.isComplete = true;
      live.delete(g);
      running--;
      accepted++;
      batch.push(g);
      if (batch.length >= rbs) sealed.push(batch.splice(0, rbs));
      admit();
      train();
    };
    admit();
  }
  const tick = () => {
    let t = 0;
    let slots = 0;
    for (const e of engines) {
      e.sync();
      t += e.tokens;
      slots += e.slotMs;
    }
    tokensAt.push([clock.now(), t]);
    slotsAt.push([clock.now(), slots]);
    if (clock.now() > 1e9) throw new Error(`policy simulation stalled after ${commits.length} of ${steps} steps`);
    if (commits.length < steps) clock.at(clock.now() + 1000, tick);
  };
  tick();
  clock.run();
  const last = mode.isAsync ? steps - 2 - mode.k : steps - 1;
  const t0 = commits[0] as number;
  const t1 = commits[last] as number;
  const nearest = (series: Array<[number, number]>, t: number) => series.reduce((best, x) => (Math.abs(x[0] - t) < Math.abs(best[0] - t) ? x : best))[1];
  const tokAt = (t: number) => nearest(tokensAt, t);
  return {
    stepMs: (t1 - t0) / last,
    samplesPerS: (1000 * rbs * n * last) / (t1 - t0),
    /** Trained real tokens per sim s over the window (steps 1..last): early completion trains shorter samples, so samples/s alone flatters it. */
    trainedTokensPerS: (1000 * trainedTokens.slice(1, last + 1).reduce((a, b) => a + b, 0)) / (t1 - t0),
    engineSlotOccupancy: (nearest(slotsAt, t1) - nearest(slotsAt, t0)) / (engineCount * p.maxRunning * (t1 - t0)),
    engineDecodeUtilization: (tokAt(t1) - tokAt(t0)) / (((engineCount * (1000 * p.maxRunning)) / (p.itl0Ms + p.itlPerReqMs * p.maxRunning) / 1000) * (t1 - t0)),
    commits,
    trainerBusyMsTotal: trainerBusyMs,
  };
}
