import { describe, expect, it } from "vitest";
import { TINY_CONFIG } from "../../model/testing.ts";
import { parameterSpecs } from "../../model/weights.ts";
import { devicePeakFlops, efficiencyMetrics, modelFlops, modelShape, SPLIT_KEYS, StepClock } from "./efficiency.ts";

describe("embedded trainer efficiency metrics", () => {
  it("counts 6·N·T + 6·L·d_model·T² per sample, a third for a forward alone", () => {
    const shape = modelShape(TINY_CONFIG);
    expect(shape.params).toBe(parameterSpecs(TINY_CONFIG).reduce((a, s) => a + s.shape.reduce((x, y) => x * y, 1), 0));
    expect(shape).toMatchObject({ layers: TINY_CONFIG.n_layers, dAttn: TINY_CONFIG.d_model });
    const expected = [3, 10].reduce((a, t) => a + 6 * shape.params * t + 6 * shape.layers * shape.dAttn * t * t, 0);
    expect(modelFlops(shape, [3, 10])).toBe(expected);
    expect(modelFlops(shape, [3, 10], true)).toBeCloseTo(expected / 3, 6);
  });

  it("builds the split from contiguous marks, and mfu only with a peak", () => {
    let t = 100;
    const clock = new StepClock(() => t);
    t += 1;
    clock.mark("load_s");
    t += 3;
    clock.mark("fwd_bwd_s");
    t += 1;
    clock.mark("fwd_bwd_s");
    const m = efficiencyMetrics(clock, 50, 10e12, 4e12);
    expect(m).toMatchObject({ load_s: 1, fwd_bwd_s: 4, critic_s: 0, push_s: 0, step_s: 5, tokens_per_s: 10, tflops: 2, model_flops_per_step: 10e12, mfu: 0.5 });
    expect(SPLIT_KEYS.reduce((a, k) => a + (m[k] as number), 0)).toBe(5);
    expect(efficiencyMetrics(clock, 50, 10e12, null)).not.toHaveProperty("mfu");
  });

  it("reads RLQ_DEVICE_PEAK_TFLOPS, and refuses a value that is not a positive number", () => {
    expect(devicePeakFlops({})).toBeNull();
    expect(devicePeakFlops({ RLQ_DEVICE_PEAK_TFLOPS: "989.4" })).toBeCloseTo(989.4e12, 0);
    for (const bad of ["fast", "0", "-1"]) {
      expect(() => devicePeakFlops({ RLQ_DEVICE_PEAK_TFLOPS: bad })).toThrow(/RLQ_DEVICE_PEAK_TFLOPS.*TFLOP\/s/);
    }
  });
});
