import type { EmbeddedFactories } from "./engines.ts";

/**
 * The embedded engine and trainer (ONNX engine, TypeScript trainer), loaded
 * lazily so that processes serving only remote engines never load
 * onnxruntime or the autodiff library.
 */
export async function loadEmbedded(): Promise<EmbeddedFactories | null> {
  return null;
}
