/**
 * On-policy distillation (slime --use-opd, docs/en/advanced/on-policy-distillation.md): a teacher
 * engine prefills each sampled sample and returns its per-token log-probs, and the advantage becomes
 * A_t − opd_kl_coef · (log π_student − log π_teacher) (src/algorithms/advantages.ts). `use_opd` and
 * `opd_kl_coef` are algorithm options (src/algorithms/options.ts); these keys say where the teacher is.
 *
 * `opd_type`: slime's `sglang` is a teacher behind its own server; rlq also serves it from vLLM
 * (`opd_teacher.kind`). slime's `megatron` (the teacher loaded beside the student in the trainer) is
 * refused by config-check (src/config/opd.ts `opdIssues`).
 */

import { z } from "zod";

export const opdTeacherSchema = z
  .object({
    /** sglang: POST /generate with max_new_tokens 0; vllm: POST /v1/completions with prompt_logprobs. */
    kind: z.enum(["sglang", "vllm"]),
    /** The teacher server's base URL (no path), e.g. http://127.0.0.1:30001. */
    url: z.string().url(),
    /** vLLM only: the served model name (`model` in /v1/completions); null: the server's first model. */
    model: z.string().min(1).nullable().default(null),
    /** One request's timeout. A teacher that does not answer is retried, never counted against the sample. */
    request_timeout_s: z.number().positive().default(120),
    /**
     * How long one reward job waits out a failing teacher (down, restarting, 5xx) before it fails
     * retriable and its queue retries it: the sample keeps waiting for its teacher's log-probs.
     */
    wait_s: z.number().positive().default(600),
  })
  .strict();
export type OpdTeacher = z.infer<typeof opdTeacherSchema>;

export const opdKeys = {
  /** slime --opd-type. `sglang`: the teacher is a server of its own (opd_teacher); `megatron` is refused. */
  opd_type: z.enum(["sglang", "megatron"]).nullable().default(null),
  /** rlq: the teacher engine (required with use_opd). */
  opd_teacher: opdTeacherSchema.nullable().default(null),
};

/** What is wrong with a run's OPD keys, as (key, message) pairs for config-check. */
export function opdIssues(c: { use_opd: boolean; opd_type: "sglang" | "megatron" | null; opd_teacher: OpdTeacher | null }): Array<[string, string]> {
  const out: Array<[string, string]> = [];
  if (!c.use_opd) return out;
  if (c.opd_type === "megatron") {
    out.push([
      "opd_type",
      "megatron loads the teacher inside slime's Megatron trainer, which rlq does not run: write opd_type: sglang and serve the teacher with SGLang or vLLM (opd_teacher: {kind: sglang|vllm, url: http://host:port})",
    ]);
  }
  if (c.opd_teacher === null) {
    out.push([
      "opd_teacher",
      "use_opd needs a teacher engine: write opd_teacher: {kind: sglang|vllm, url: http://host:port} (a server with the teacher model loaded)",
    ]);
  }
  return out;
}
