import type { EmbeddedFactories } from "./engines.ts";
import { RlqError } from "../lib/errors.ts";

/**
 * The embedded engine and trainer (ONNX engine, TypeScript trainer), loaded
 * lazily so that processes serving only remote engines never load
 * onnxruntime or the autodiff library.
 */
export async function loadEmbedded(): Promise<EmbeddedFactories | null> {
  return {
    async createEngine(ctx) {
      const { createEmbeddedEngine } = await import("../engines/embedded/embedded-engine.ts");
      const ref = ctx.config.ref_load;
      if (!ref) throw new RlqError("config_invalid", "engine.kind embedded needs ref_load (the checkpoint to serve)");
      const logitNoiseStd = ctx.config.engine.kind === "embedded" ? ctx.config.engine.logit_noise_std : 0;
      return createEmbeddedEngine({ checkpointUri: ref, id: `embedded-${process.pid}`, logitNoiseStd });
    },
    async createTrainer() {
      const { createEmbeddedTrainer } = await import("../trainer/embedded/embedded-trainer.ts");
      return createEmbeddedTrainer();
    },
  };
}
