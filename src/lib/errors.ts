/**
 * Errors carry a stable `code` and a `cause`. Every code rlq throws has a row
 * in ERROR_CODES (documented in docs/errors.md): whether it is retriable and
 * what it means. An RlqError's `isRetriable` defaults to its row; rows marked
 * "varies" are decided at the throw site (by HTTP status, by the last
 * failure) and default to not retriable. Whether a job is retried is decided
 * once, at the processor edge (queue/worker-host.ts), from `isRetriable`.
 */
export interface ErrorCodeRow {
  /** true: transient (network, 5xx, a restart); false: retrying gives the same answer; "varies": decided at the throw site. */
  retriable: boolean | "varies";
  meaning: string;
}

export const ERROR_CODES = {
  config_invalid: {
    retriable: false,
    meaning: "The run config, an env var or a CLI value is not what rlq expects; the message names the field, the value and what was expected.",
  },
  secret_unavailable: { retriable: false, meaning: "A secret ({env: NAME} or {file: PATH}) could not be read." },
  db_not_migrated: { retriable: false, meaning: "The database has no rlq schema yet: run `rlq migrate`." },
  run_not_found: { retriable: false, meaning: "No run with that id." },
  sample_not_found: { retriable: false, meaning: "No such sample (dashboard)." },
  run_request_not_found: { retriable: false, meaning: "No run change request with that id (changeOutcome, waitForChange)." },
  resume_refused: { retriable: false, meaning: "The run's dataset or a plugin changed since it started; it will not resume." },
  dataset_changed: { retriable: false, meaning: "The dataset's fingerprint differs from the one recorded when the run started." },
  dataset_missing: { retriable: false, meaning: "The prompt data file does not exist." },
  dataset_empty: { retriable: false, meaning: "The prompt data has no usable rows." },
  dataset_invalid: { retriable: false, meaning: "The prompt data file cannot be read as JSONL/Parquet of the expected shape." },
  dataset_bad_row: { retriable: false, meaning: "A dataset row lacks the input key or has a value of the wrong type." },
  tokenizer_missing: { retriable: false, meaning: "No tokenizer file where the config points." },
  tokenizer_invalid: { retriable: false, meaning: "The tokenizer file cannot be parsed." },
  tokenizer_cannot_encode: { retriable: false, meaning: "The demo tokenizer has no token for a character of the text." },
  tokenizer_no_chat_template: { retriable: false, meaning: "apply_chat_template is set but the tokenizer has no chat template." },
  model_invalid: { retriable: false, meaning: "A model file (config, safetensors, checkpoint) is missing, malformed or does not match the model config." },
  dashboard_port_in_use: { retriable: false, meaning: "The dashboard's port is taken." },
  dashboard_bad_query: { retriable: false, meaning: "The dashboard was asked for something it does not serve." },
  sql_refused: { retriable: false, meaning: "`rlq sql` refused a statement (not one read-only query)." },
  plugin_missing: { retriable: false, meaning: "A plugin module path does not exist." },
  plugin_load_failed: { retriable: false, meaning: "A plugin module could not be imported." },
  plugin_bad_export: { retriable: false, meaning: "A plugin module does not export the expected function." },
  plugin_bad_return: { retriable: false, meaning: "A plugin returned a value of the wrong shape." },
  plugin_bad_call: { retriable: false, meaning: "A plugin called rlq's context wrongly (for example ctx.generate with a prompt not from ctx.datasets)." },
  plugin_threw: { retriable: false, meaning: "A plugin function threw; the run pauses with its message." },
  plugin_http_failed: { retriable: "varies", meaning: "An HTTP plugin endpoint gave up (retriable when its last failure was transient)." },
  plugin_sidecar_failed: { retriable: true, meaning: "The Python plugin host exited or could not start; it is started again and the job retried." },
  plugin_reward_invalid: { retriable: false, meaning: "A reward function returned something that is not a reward." },
  plugin_group_reward_invalid: { retriable: false, meaning: "A group reward function returned the wrong number or kind of rewards." },
  plugin_filter_invalid: { retriable: false, meaning: "A dynamic sampling filter returned the wrong shape." },
  buffer_filter_invalid: { retriable: false, meaning: "A buffer filter returned groups that are not in the buffer." },
  unknown_filter: { retriable: false, meaning: "A filter name that rlq does not know." },
  custom_generate_invalid: { retriable: false, meaning: "A custom generate function returned turns that break its contract." },
  amend_refused: {
    retriable: false,
    meaning: "`rlq run amend` asked for a key that cannot change on a live run, or a num_rollout below the steps already sealed.",
  },
  rollout_fn_blocked: { retriable: false, meaning: "A rollout function sat blocked on something that is not a ctx call." },
  rollout_fn_nondeterministic: { retriable: false, meaning: "A rollout function decided differently on replay than when it ran." },
  reward_key_required: { retriable: false, meaning: "The reward is a dict of components and no reward_key picks one." },
  reward_key_not_found: { retriable: false, meaning: "reward_key names a component the reward does not have." },
  reward_key_not_numeric: { retriable: false, meaning: "The component reward_key picks is not a number." },
  reward_key_missing: { retriable: false, meaning: "A reward lacks the component that reward_key names." },
  unknown_rm_type: { retriable: false, meaning: "An rm_type rlq does not know." },
  rm_type_not_in_process: { retriable: false, meaning: "That rm_type cannot run in this process." },
  invalid_label: { retriable: false, meaning: "A label the reward cannot read." },
  invalid_reward_input: { retriable: false, meaning: "A sample the reward cannot score." },
  empty_group: { retriable: false, meaning: "A filter was given a group with no samples." },
  remote_reward_failed: {
    retriable: "varies",
    meaning: "The remote reward server (rm_url) gave up: retriable when its last failure was transient (network, 5xx, 408, 429), not for another 4xx.",
  },
  remote_call_failed: { retriable: "varies", meaning: "A retried HTTP POST gave up (same rule as remote_reward_failed)." },
  http_unreachable: {
    retriable: true,
    meaning: "lib/http-client.ts: no connection, or it broke before the answer was in (refused, reset, unreachable host, DNS).",
  },
  http_timeout: { retriable: true, meaning: "lib/http-client.ts: no answer within the call's timeout." },
  http_cancelled: { retriable: false, meaning: "lib/http-client.ts: the caller cancelled the call." },
  engine_unreachable: { retriable: true, meaning: "An inference server could not be reached (refused, reset, DNS, socket closed)." },
  engine_timeout: { retriable: true, meaning: "An inference server gave no answer within the request's timeout." },
  engine_http_error: { retriable: "varies", meaning: "An inference server answered non-2xx: retriable for 5xx, 408, 429." },
  engine_unauthorized: { retriable: false, meaning: "An inference server wants an API key (engine.api_key)." },
  engine_admin_unauthorized: {
    retriable: false,
    meaning: "An SGLang server refused an admin call (abort, weight load, pause, flush): it runs --admin-api-key, which engine.admin_api_key must name.",
  },
  engine_bad_response: {
    retriable: "varies",
    meaning: "An inference server's answer is not JSON or not the expected shape (mostly retriable: a restarting server can answer garbage).",
  },
  engine_request_rejected: {
    retriable: false,
    meaning: "The server refused this request for itself (a prompt over the context length): the sample fails, the engine is fine.",
  },
  engine_request_failed: { retriable: true, meaning: "A request failed on every attempt the pool gave it." },
  engine_server_abort: { retriable: true, meaning: "The server aborted the request with an error status." },
  engine_unavailable: { retriable: true, meaning: "No engine in the pool is routable (none ready, or none reported a version)." },
  engine_version_changed: { retriable: true, meaning: "Internal: the weight version changed under a streaming request." },
  engine_version_mismatch: { retriable: true, meaning: "An engine reports a weight version other than the one expected." },
  engine_version_timeout: { retriable: true, meaning: "Engines did not all report the pushed version in time." },
  engine_no_version: { retriable: true, meaning: "An engine did not report a weight version." },
  engine_bad_version: { retriable: false, meaning: "An engine reports a weight version that is not a number." },
  engine_load_failed: { retriable: "varies", meaning: "No engine loaded the checkpoint (retriable when the underlying failure was)." },
  engine_cannot_load: {
    retriable: false,
    meaning: "This engine cannot take the run's weight updates (the message names what is missing: a load route, a push route, a frontend or a DP layout).",
  },
  engine_logprobs_truncated: { retriable: false, meaning: "The engine's log-probs are taken after top-p/top-k truncation but the sampling needs them before." },
  engine_logprobs_unscaled: { retriable: false, meaning: "The engine's log-probs are taken before temperature but rollout_temperature is not 1." },
  engine_model_missing: { retriable: false, meaning: "The server does not serve the configured model." },
  engine_not_generative: { retriable: false, meaning: "The server's model is not a generation model." },
  embedded_engine_closed: { retriable: true, meaning: "The embedded engine was closed with the request in it (a worker shutting down)." },
  embedded_duplicate_request: { retriable: true, meaning: "The embedded engine already has a request with that id in flight." },
  embedded_invalid_request: { retriable: false, meaning: "The embedded engine refused a request that does not fit its schema or the model." },
  embedded_load_failed: { retriable: true, meaning: "The embedded engine could not load a checkpoint." },
  embedded_worker_failed: { retriable: true, meaning: "The embedded engine's worker thread failed or exited." },
  trainer_unreachable: {
    retriable: "varies",
    meaning: "No connection to the remote trainer: an outage, waited out up to trainer_unreachable_timeout_s (retriable), then final.",
  },
  trainer_timeout: { retriable: true, meaning: "The trainer connected but gave no answer in time (a hung trainer)." },
  trainer_request_failed: { retriable: true, meaning: "A trainer request failed in another way." },
  trainer_bad_response: { retriable: "varies", meaning: "The trainer's answer is not JSON or not the protocol's shape." },
  trainer_lost_attempt: { retriable: true, meaning: "The trainer restarted and no longer knows the attempt." },
  trainer_attempt_superseded: { retriable: true, meaning: "The trainer runs another attempt of the step." },
  trainer_worker_failed: { retriable: true, meaning: "The embedded trainer's worker thread failed or exited." },
  trainer_closed: { retriable: false, meaning: "The trainer was used after close()." },
  trainer_config: { retriable: false, meaning: "The trainer refuses the run's training config." },
  trainer_unsupported: { retriable: false, meaning: "The trainer lacks a capability the config needs (e.g. a critic for ppo)." },
  trainer_empty_batch: { retriable: false, meaning: "A train step got a batch with no trainable tokens." },
  trainer_no_initial_weights: { retriable: false, meaning: "No initial checkpoint to train from." },
  trainer_version_mismatch: { retriable: "varies", meaning: "The trainer holds another weight version than the step expects." },
  trainer_bad_batch: { retriable: false, meaning: "A train batch (RLQB) is malformed or inconsistent." },
  trainer_bad_request: {
    retriable: "varies",
    meaning: "Trainer protocol `bad_request`: the request does not follow docs/trainer-protocol.md (the trainer says not retryable).",
  },
  trainer_unauthorized: { retriable: "varies", meaning: "Trainer protocol `unauthorized`: missing or wrong bearer token (trainer.api_key)." },
  trainer_version_unavailable: { retriable: "varies", meaning: "Trainer protocol `version_unavailable`: the trainer cannot read checkpoint_uri_in." },
  trainer_batch_fetch_failed: { retriable: "varies", meaning: "Trainer protocol `batch_fetch_failed`: batch_url did not answer a valid RLQB batch." },
  trainer_oom: { retriable: "varies", meaning: "Trainer protocol `oom`: the trainer ran out of device memory." },
  trainer_not_found: {
    retriable: "varies",
    meaning: "Trainer protocol `not_found`: the trainer has no such step (it restarted, or the step was never requested).",
  },
  trainer_internal: {
    retriable: "varies",
    meaning:
      "The trainer failed in its own code: the protocol's `internal`, or an error in the embedded trainer's worker that is not an RlqError (its stack in the message).",
  },
  trainer_http_error: { retriable: "varies", meaning: "The trainer answered non-2xx without the protocol's error body: retriable for 5xx, 408, 429." },
  trainer_error: {
    retriable: "varies",
    meaning:
      "The trainer reported a code outside docs/trainer-protocol.md's set (its code is in the message), or failed with no error: as its retryable flag says.",
  },
  train_cancelled: { retriable: true, meaning: "The attempt was cancelled (stall watchdog or operator)." },
  train_aborted: { retriable: true, meaning: "The train step was aborted." },
  train_nonfinite: {
    retriable: false,
    meaning: "The gradient norm is NaN or infinite: the weights are not updated (a retry from the same weights gives the same).",
  },
  train_stalled: { retriable: true, meaning: "No progress for train_stall_timeout_s: the attempt is retried." },
  worker_shutdown: { retriable: true, meaning: "The worker is shutting down: the job goes back to the queue without using an attempt." },
  infra_unreachable: {
    retriable: true,
    meaning: "Postgres or Redis stayed out of reach for RLQ_OUTAGE_TIMEOUT_S while a job waited it out (lib/infra-outage.ts): the job spends an attempt.",
  },
  batch_inconsistent: { retriable: false, meaning: "A sealed batch does not match the facts it references." },
  checkpoint_fetch_failed: { retriable: "varies", meaning: "Downloading a checkpoint failed (not retried on 401/403)." },
  checkpoint_hash_mismatch: { retriable: "varies", meaning: "A downloaded checkpoint file's sha256 differs from the one reported." },
  checkpoint_not_kept: { retriable: false, meaning: "The checkpoint a retrain needs was deleted by retention." },
  retrain_no_step: { retriable: false, meaning: "rlq retrain: the run has no such committed step." },
  version_unavailable: { retriable: true, meaning: "The weight version a job needs is not committed/available yet." },
  no_decision_behind_job: { retriable: false, meaning: "A job with no decision behind it (the outbox rule): refused." },
  no_fact_behind_job: { retriable: false, meaning: "A job whose input facts are missing." },
  group_not_found: { retriable: false, meaning: "A group id with no draw behind it." },
  decision_log_corrupt: { retriable: false, meaning: "The decision log has a gap or a decision of an unknown kind." },
  config_version_unknown: {
    retriable: false,
    meaning: "A recorded run config has a config_version newer than this rlq knows (config/config-versions.ts): the run was recorded by a newer rlq.",
  },
  lease_lost: { retriable: false, meaning: "This controller no longer holds the run's lease." },
  embedded_pg_failed: { retriable: false, meaning: "The embedded Postgres could not start." },
  embedded_pg_unreachable: { retriable: false, meaning: "The embedded Postgres did not accept connections." },
  invariant_violated: { retriable: false, meaning: "An internal invariant does not hold (a bug in rlq): not retried, the run pauses with the message." },
  algo_shape_mismatch: { retriable: false, meaning: "algorithms/: arrays of mismatched shapes (a bug in the caller)." },
  algo_missing_input: { retriable: false, meaning: "algorithms/: an input the chosen estimator needs is missing (e.g. values for GAE)." },
  algo_bad_argument: { retriable: false, meaning: "algorithms/: an argument out of its range." },
  algo_empty_mask: { retriable: false, meaning: "algorithms/: a loss mask with no token (slime raises ValueError)." },
  wandb_no_key: { retriable: false, meaning: "wandb is configured without an API key." },
  wandb_bad_answer: { retriable: false, meaning: "wandb answered something unexpected." },
  wandb_unreachable: { retriable: true, meaning: "wandb could not be reached." },
  wandb_auth: { retriable: false, meaning: "wandb refused the API key (401/403)." },
  wandb_http: { retriable: "varies", meaning: "wandb answered another non-2xx status: retriable for 5xx and 429." },
} as const satisfies Record<string, ErrorCodeRow>;

/** A code from the table: the compiler refuses any other string, so no code is built at run time. */
export type ErrorCode = keyof typeof ERROR_CODES;

export function isErrorCode(code: string): code is ErrorCode {
  return Object.hasOwn(ERROR_CODES, code);
}

/** The table's row for a code; null for a string that is not a code. */
export function errorCodeRow(code: string): ErrorCodeRow | null {
  return isErrorCode(code) ? ERROR_CODES[code] : null;
}

/**
 * The trainer protocol's error codes (docs/trainer-protocol.md, workers/trainer-torch/protocol.py)
 * and the table's code for each. A code the trainer sends outside this set is `trainer_error`,
 * its own code kept in the message (`trainerErrorCode`).
 */
export const TRAINER_PROTOCOL_CODES = {
  bad_request: "trainer_bad_request",
  unauthorized: "trainer_unauthorized",
  version_unavailable: "trainer_version_unavailable",
  batch_fetch_failed: "trainer_batch_fetch_failed",
  oom: "trainer_oom",
  not_found: "trainer_not_found",
  internal: "trainer_internal",
} as const satisfies Record<string, ErrorCode>;

/** The table's code for a code the trainer sent in its protocol: its row, or `trainer_error` for one outside the protocol. */
export function trainerErrorCode(wireCode: string): ErrorCode {
  return Object.hasOwn(TRAINER_PROTOCOL_CODES, wireCode) ? TRAINER_PROTOCOL_CODES[wireCode as keyof typeof TRAINER_PROTOCOL_CODES] : "trainer_error";
}

export class RlqError extends Error {
  readonly code: ErrorCode;
  readonly isRetriable: boolean;
  /** `isRetriable` defaults to the code's row (false for a "varies" row). */
  constructor(code: ErrorCode, message: string, options: { cause?: unknown; isRetriable?: boolean } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = "RlqError";
    this.code = code;
    this.isRetriable = options.isRetriable ?? errorCodeRow(code)?.retriable === true;
  }
}

/** Postgres SQLSTATEs of a transaction that lost a race (40001 serialization failure, 40P01 deadlock): the same work run again can commit. */
const PG_RACE_CODES = new Set(["40001", "40P01"]);

/**
 * Whether a failed job is tried again: an RlqError as its code's row (or its
 * throw site) says. Any other error is retried only where a reason is named
 * here: a Postgres transaction that lost a race (PG_RACE_CODES, anywhere in
 * the `cause` chain, as drizzle wraps pg's error). Everything else (a
 * TypeError, a RangeError, a plain Error) is a bug in rlq: the same input
 * fails the same way, so it is not retried and is reported with its stack
 * (queue/worker-host.ts). Postgres or Redis out of reach is waited out before
 * this is asked (lib/infra-outage.ts), and past the wait it is `infra_unreachable`.
 */
export function isRetriable(error: unknown): boolean {
  if (error instanceof RlqError) return error.isRetriable;
  for (let c: unknown = error, depth = 0; c instanceof Error && depth < 8; c = c.cause, depth++) {
    const code = (c as { code?: unknown }).code;
    if (typeof code === "string" && PG_RACE_CODES.has(code)) return true;
  }
  return false;
}

/** An error rlq did not throw on purpose: not an RlqError (nor a cause chain rlq named), a bug to report with its stack. */
export function isBug(error: unknown): boolean {
  return !(error instanceof RlqError) && !isRetriable(error);
}

export function errorMessage(error: unknown): string {
  if (error instanceof Error) return error.message;
  return String(error);
}
