/**
 * rlq's programmatic API for scripts:
 *   import { runUntilDone, startRun, runStatus, watchRun, requestRunChange, waitForChange, createServices, readEnv } from "rlq";
 */
export { startRun, runStatus, requestRunChange, newRunId, type StartRunOptions, type RunStatusReport } from "./api.ts";
export { createServices, type Services } from "./runtime/services.ts";
export { runUntilDone, type RunUntilDoneOptions, type RunUntilDoneResult } from "./run-until-done.ts";
export { watchRun, changeOutcome, waitForChange, type RunProgress, type WatchOptions, type ChangeOutcome } from "./run-watch.ts";
export { checkAmend } from "./config/amend.ts";
export type { RunRequestKind } from "./store/run-requests.ts";
export { readEnv } from "./config/env.ts";
export { runConfigSchema, parseRunConfig, type RunConfig, type RunConfigInput } from "./config/run-config.ts";
export type { Engine, GenerateRequest, GenerateResult } from "./engines/engine.ts";
export type { Trainer, TrainRequest, TrainResult, TrainBatch, TrainSample } from "./trainer/trainer.ts";
export type {
  RolloutFunction,
  RolloutTrainContext,
  RolloutEvalContext,
  RolloutGroup,
  RolloutSample,
  EvalPrompt,
  EvalSample,
} from "./rollout/rollout-function-contract.ts";
export { parseSlimeScript, type SlimeScript } from "./config/slime-script.ts";
export { importSlimeArgs, formatImportReport, importedYaml, type ImportReport } from "./config/slime-import.ts";
export { checkConfig, type CheckWarning } from "./config/config-check.ts";
