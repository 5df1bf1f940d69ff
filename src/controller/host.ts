import type { Db, Database } from "../store/db.ts";
import type { Queues } from "../queue/queues.ts";
import type { RunState } from "../core/run-state.ts";
import type { Decision } from "../core/decisions.ts";
import type { Dataset } from "../data/dataset.ts";
import type { BufferFilter, DynamicFilter } from "../runtime/filters.ts";
import type { RunContext, RunContextCache } from "../runtime/run-context.ts";
import type { Logger } from "../observability/logger.ts";
import type { EngineAdmin } from "./engine-admin.ts";

export interface ControllerDeps {
  db: Db;
  queues: Queues;
  contexts: RunContextCache;
  log: Logger;
  holder: string;
  crashPoint(name: string): void;
  pollMs?: number;
  reconcileMs?: number;
  engineAdmin?: (ctx: RunContext) => EngineAdmin;
}

/**
 * What the controller's parts (the sync step, the async pipeline, reconcile,
 * operator requests) share: the run's live state and the one way to change
 * it. Every change is a committed decision (`commit`); `commitThenEnqueue` is
 * the outbox: the decisions first, then the jobs they call for (`jobFor`).
 */
export interface ControllerHost {
  readonly deps: ControllerDeps;
  /**
   * The run's state as of the last commit. A commit replaces it with a new value and never changes
   * the old one: a part that holds `const s = h.state` across an `await h.commit(...)` holds the
   * state it decided from, and reads `h.state` again for what the commit decided.
   */
  readonly state: RunState;
  readonly ctx: RunContext;
  readonly dataset: Dataset;
  readonly filter: DynamicFilter;
  readonly bufferFilter: BufferFilter;
  readonly engines: EngineAdmin;
  /** Commit decisions (and writes that must land with them), then fold them into a new `state`. */
  commit(list: Decision[], extra?: (tx: Database) => Promise<void>): Promise<void>;
  /** `commit`, then the crash point (tests), then the decisions' jobs. */
  commitThenEnqueue(list: Decision[], options?: { extra?: (tx: Database) => Promise<void>; crashPoint?: string }): Promise<void>;
  /** Pause the run with a reason (no-op unless running). */
  pause(reason: string): Promise<void>;
}
