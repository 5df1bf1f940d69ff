import type { RunConfig } from "../config/run-config.ts";
import { createTeacher, teacherLogProbsWaiting, type TeacherEngine } from "../engines/teacher.ts";
import { RlqError, errorMessage } from "../lib/errors.ts";

/** A reward job's logger: teacher retries are logged, never silent. */
interface Log {
  warn(obj: object, msg: string): void;
}

const teachers = new Map<string, TeacherEngine>();

/** The run's teacher engine (one client per teacher config; it holds no connection of its own). */
function teacherFor(config: RunConfig): TeacherEngine {
  const t = config.opd_teacher;
  if (t === null) throw new RlqError("invariant_violated", "use_opd without opd_teacher passed config validation");
  const key = JSON.stringify(t);
  let teacher = teachers.get(key);
  if (!teacher) {
    teacher = createTeacher(t);
    teachers.set(key, teacher);
  }
  return teacher;
}

/**
 * use_opd: the teacher's log-probs of each sample's response tokens, asked before the round's
 * rewards are written, so they land in the same row (sample_rewards.teacher_log_probs) and the
 * round counts as scored only once every sample has them. A failing teacher is waited out
 * (engines/teacher.ts `teacherLogProbsWaiting`), then the job fails retriable: the sample is never
 * failed or dropped for its teacher, as slime's reward_func retries the teacher
 * (slime/rollout/on_policy_distillation.py) but without its final give-up.
 */
export async function teacherLogProbsOfRound(
  config: RunConfig,
  promptTokens: readonly number[],
  samples: ReadonlyArray<{ sampleIndex: number; responseTokens: readonly number[] }>,
  log: Log | null,
  jobId: string,
): Promise<Map<number, number[]>> {
  const teacher = teacherFor(config);
  const waitMs = (config.opd_teacher?.wait_s ?? 600) * 1000;
  const rows = await Promise.all(
    samples.map(async (s) => {
      const lp = await teacherLogProbsWaiting(
        teacher,
        { tokens: [...promptTokens, ...s.responseTokens], promptLength: promptTokens.length },
        {
          waitMs,
          onRetry: (e, attempt) =>
            log?.warn({ jobId, sampleIndex: s.sampleIndex, attempt, err: errorMessage(e) }, "OPD teacher failed; the sample waits for it"),
        },
      );
      return [s.sampleIndex, Array.from(lp)] as const;
    }),
  );
  return new Map(rows);
}
