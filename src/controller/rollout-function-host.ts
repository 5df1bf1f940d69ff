import type { Db, Database } from "../store/db.ts";
import type { Queues } from "../queue/queues.ts";
import type { RunState } from "../core/run-state.ts";
import type { Decision, DecisionPayload } from "../core/decisions.ts";
import type { Dataset } from "../data/dataset.ts";
import type { Tokenizer } from "../data/tokenizer.ts";
import type { BufferFilter, DynamicFilter } from "../runtime/filters.ts";
import type { DynamicFilterOutput } from "../filters/index.ts";
import type { Logger } from "../observability/logger.ts";
import type { RolloutGroup, RolloutSample } from "../rollout/rollout-function-contract.ts";
import type { CallJournal, JournalCall } from "./rollout-journal.ts";
import type { RlqError } from "../lib/errors.ts";

/** What the rollout-function driver (rollout-function.ts) and its seal (rollout-function-seal.ts) share. */
export interface RolloutFunctionHost {
  db: Db;
  queues: Queues;
  log: Logger;
  crashPoint(name: string): void;
  /** The controller's live state (mutated by `commit`). */
  state(): RunState;
  /** Commit decisions (and writes that land with them), then fold them in. */
  commit(list: Decision[], extra?: (tx: Database) => Promise<void>): Promise<void>;
  /** Pause the run with a reason (no-op unless running). */
  pause(reason: string): Promise<void>;
  dataset: Dataset;
  tokenizer: Tokenizer;
  filter: DynamicFilter;
  bufferFilter: BufferFilter;
}

export interface RolloutFunctionDriver {
  /** The collect phase of the current step: returns whether anything happened. */
  tick(): Promise<boolean>;
}

export type CallRecord = DecisionPayload<"rollout_fn.called">;
export type Input =
  | { op: "draw"; n: number }
  | { op: "generate"; groupId: number }
  | { op: "filter_dynamic"; groupId: number; round: number; samples: readonly RolloutSample[] }
  | { op: "add_to_buffer"; groups: Array<{ groupId: number; round: number | null }> };
export type Call = JournalCall<CallRecord, Input>;

/** A group as the function has seen it this step: changes only at its own calls and at deliveries. */
export type SeenGroup =
  | { phase: "drawn" | "generating" | "buffered"; group: RolloutGroup }
  | { phase: "generated"; group: RolloutGroup; samples: readonly RolloutSample[]; round: number };

/** Ticks the function may sit blocked on something that is not a ctx call before the run pauses. */
export const MAX_STUCK_TICKS = 300;

export interface Execution {
  step: number;
  journal: CallJournal<CallRecord, Input>;
  seen: Map<number, SeenGroup>;
  /** The round each generate call waits on (its first round, then continuations). */
  genRound: Map<number, number>;
  /** Filter verdicts in call order (effect time): group → {round, verdict}. */
  verdicts: Map<number, { round: number; verdict: DynamicFilterOutput }>;
  /** The first misuse of ctx: the run pauses with it. */
  fatal: RlqError | null;
  stuckTicks: number;
}

export function where(path: string, step: number): string {
  return `rollout_function_path ${path} step ${step}`;
}

/** The function's recorded filter verdict on a group's round (none recorded: kept). */
export function verdictFor(ex: Execution, groupId: number, round: number): { keep: boolean; reason: string | null } {
  const v = ex.verdicts.get(groupId);
  return v && v.round === round ? { keep: v.verdict.keep, reason: v.verdict.reason } : { keep: true, reason: null };
}
