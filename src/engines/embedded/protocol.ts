/** Messages between the embedded engine (main thread) and its worker thread. */

import type { ModelConfig } from "../../model/config.ts";
import type { GenerateRequest } from "../engine.ts";
import type { SchedulerResult } from "./scheduler.ts";

export interface EngineWorkerData {
  /** Model file to start from (its metadata gives the version and config). */
  checkpointPath: string;
  maxBatchSize: number;
  intraOpNumThreads: number;
  logitNoiseStd: number;
}

/**
 * Requests and results travel in batches: the generate() calls of one main-thread turn go as
 * one message, and the requests a worker tick finishes come back as one. One message per
 * request made the worker start a batch before its last request had arrived, and cost a
 * structured clone each (bench/embedded-model.ts).
 */
export type ToWorker =
  | { type: "generate"; requests: GenerateRequest[] }
  | { type: "abort"; ids: string[]; ticket: number }
  | { type: "load"; version: number; path: string; ticket: number }
  | { type: "close" };

export type FromWorker =
  | { type: "ready"; version: number; config: ModelConfig }
  | { type: "done"; results: Array<{ requestId: string; result: SchedulerResult }> }
  | { type: "failed"; requestId: string; message: string }
  | { type: "ack"; ticket: number; error?: string }
  | { type: "fatal"; message: string };
