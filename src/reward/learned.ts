/**
 * @file The learned reward model's entry point for the reward scorer (`rm_type: onnx_rm`) and for plugins: a
 * `custom_rm_path` that makes a multi-component reward loads the model once and returns its score beside rule-based
 * components (docs/rewards.md "onnx_rm"). onnxruntime-node is imported on the first call only, so a process that
 * scores no learned reward never loads it.
 */

import type { OnnxRewardModel, OnnxRewardModelOptions } from "./onnx-rm.ts";

export type { OnnxRewardModel, OnnxRewardModelOptions } from "./onnx-rm.ts";

/** The reward model of `dir` (see reward/onnx-rm.ts for the directory's files and the errors). */
export async function loadOnnxRewardModel(dir: string, options: OnnxRewardModelOptions = {}): Promise<OnnxRewardModel> {
  const { loadOnnxRewardModel: load } = await import("./onnx-rm.ts");
  return load(dir, options);
}
