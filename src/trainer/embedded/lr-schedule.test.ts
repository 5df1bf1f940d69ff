/**
 * @file The embedded trainer's LR schedule against Megatron's OptimizerParamScheduler,
 * written out here from megatron/core/optimizer_param_scheduler.py (step(0) when it is
 * built, step() after every optimizer step), over the schedules
 * workers/trainer-torch/tests/test_optimizer_schedule.py runs through real train steps.
 */
import { describe, expect, it } from "vitest";
import { learningRate, type LrSchedule } from "./lr-schedule.ts";

class MegatronScheduler {
  numSteps = 0;
  lr = 0;
  constructor(
    private readonly maxLr: number,
    private readonly minLr: number,
    private readonly warmupSteps: number,
    private readonly decaySteps: number,
    private readonly style: "constant" | "linear" | "cosine",
    private readonly initLr = 0,
  ) {
    this.step(0);
  }

  getLr(): number {
    if (this.warmupSteps > 0 && this.numSteps <= this.warmupSteps) {
      return this.initLr + ((this.maxLr - this.initLr) * this.numSteps) / this.warmupSteps;
    }
    if (this.style === "constant") return this.maxLr;
    if (this.numSteps > this.decaySteps) return this.minLr;
    const decayRatio = (this.numSteps - this.warmupSteps) / (this.decaySteps - this.warmupSteps);
    const coeff = this.style === "linear" ? 1 - decayRatio : 0.5 * (Math.cos(Math.PI * decayRatio) + 1);
    return this.minLr + coeff * (this.maxLr - this.minLr);
  }

  step(increment = 1): void {
    this.numSteps += increment;
    this.lr = this.getLr();
  }
}

const schedules: LrSchedule[] = [
  { lr: 1e-2, minLr: 1e-3, style: "cosine", warmupIters: 3, decayIters: 15 },
  { lr: 5e-3, minLr: 0, style: "linear", warmupIters: 2, decayIters: 18 },
  { lr: 1e-3, minLr: 0, style: "constant", warmupIters: 5, decayIters: null },
  { lr: 2e-3, minLr: 1e-4, style: "cosine", warmupIters: 0, decayIters: 10 },
];

describe("learningRate", () => {
  for (const s of schedules) {
    it(`equals Megatron's get_lr over 20 optimizer steps: ${s.style}, warmup ${s.warmupIters}, decay ${s.decayIters}, min_lr ${s.minLr}`, () => {
      const megatron = new MegatronScheduler(s.lr, s.minLr, s.warmupIters, s.decayIters ?? 0, s.style);
      for (let iteration = 0; iteration < 20; iteration++) {
        expect(Math.abs(learningRate(s, iteration) - megatron.lr), `optimizer step ${iteration}`).toBeLessThanOrEqual(1e-12);
        megatron.step();
      }
    });
  }

  it("reads no step ahead: warmup 2 then linear to 0 at 6 gives 0, 0.5, 1, 0.75, 0.5, 0.25, 0", () => {
    const s: LrSchedule = { lr: 1, minLr: 0, style: "linear", warmupIters: 2, decayIters: 6 };
    expect(Array.from({ length: 8 }, (_, i) => learningRate(s, i))).toEqual([0, 0.5, 1, 0.75, 0.5, 0.25, 0, 0]);
  });
});
