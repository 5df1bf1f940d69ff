/**
 * slime's SFT recipe (slime/rollout/sft_rollout.py with `--loss-type sft_loss`; its example
 * scripts also pass `--disable-compute-advantages-and-returns` and `--debug-train-only`) imported
 * to rlq's SFT run mode (loss_type sft_loss, docs/sft.md). Used by the importer
 * (slime-import.ts) for the flags whose disposition depends on whether the script is an SFT one.
 */
export const SLIME_SFT_ROLLOUT = "slime.rollout.sft_rollout.generate_rollout";

/** Whether slime's argv (as the importer's settings) trains SFT. */
export function isSlimeSft(settings: ReadonlyArray<{ key: string; words: readonly string[] }>): boolean {
  return settings.some((x) => x.key === "loss_type" && x.words[0] === "sft_loss");
}

/**
 * How an SFT script's flag imports when the SFT mode covers it: `built_in` (what rlq's SFT mode
 * does itself) or `dropped` (nothing to do in an SFT run). null: the flag's usual disposition.
 */
export function sftFlagDisposition(key: string, words: readonly string[], isSft: boolean): { kind: "built_in" | "dropped"; note: string } | null {
  if (!isSft) return null;
  if (key === "rollout_function_path" && words.length === 1 && words[0] === SLIME_SFT_ROLLOUT)
    return { kind: "built_in", note: "slime's SFT rollout: rlq's SFT run mode (loss_type sft_loss) feeds the rows to the trainer itself" };
  if (key === "disable_compute_advantages_and_returns") return { kind: "dropped", note: "an SFT run's loss reads no advantages" };
  if (key === "debug_train_only") return { kind: "dropped", note: "an SFT run has no rollouts: rlq trains it without an engine" };
  return null;
}
