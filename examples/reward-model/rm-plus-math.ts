import type { RunConfig } from "../../src/config/run-config.ts";
import { loadOnnxRewardModel, mathReward, type OnnxRewardModel } from "../../src/reward/index.ts";

/**
 * @file A multi-component reward (`custom_rm_path` with `group_rm: true`, `reward_key: score`): the learned reward
 * model's score (rm_model_path, docs/rewards.md "onnx_rm") plus the rule-based `math` grade, each kept as its own
 * component so both are stored and queryable. The model is loaded once per process and scores a group in one
 * batched call.
 */
let model: Promise<OnnxRewardModel> | null = null;

export async function rewardGroup(
  args: Pick<RunConfig, "rm_model_path">,
  samples: readonly { prompt: string; response: string; label: string | null }[],
): Promise<Array<{ score: number; rm: number; acc: number }>> {
  if (args.rm_model_path === null) throw new Error("rm-plus-math needs rm_model_path (the reward model directory) in the run config");
  model ??= loadOnnxRewardModel(args.rm_model_path);
  const scores = await (await model).score(samples);
  return samples.map((s, i) => {
    const acc = mathReward({ response: s.response, label: s.label });
    return { score: (scores[i] as number) + acc, rm: scores[i] as number, acc };
  });
}
