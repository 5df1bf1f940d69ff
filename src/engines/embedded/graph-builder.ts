/**
 * Builds the model's ONNX graphs from its config. Weights are graph INPUTS, not
 * initializers, so a new weight version is a new set of feeds and never a
 * rebuild (a tensor input costs microseconds per call, a rebuild milliseconds).
 *
 * Two graphs share the weight inputs:
 * - prefill: one or more whole sequences from position 0; returns logits for every
 *   position and each layer's K/V, which the engine copies into its cache slots.
 * - decode: one new token per row against a fixed-length cache [B, H, S, hd]
 *   owned by JS. The new key/value are merged into the scores with `Where` at
 *   slot `position` instead of being concatenated after the cache, so a row's
 *   arithmetic never depends on the other rows' lengths: batched decode gives
 *   bit-identical tokens to decoding a request alone (tested).
 *
 * IR 10 / opset 21 (ORT 1.30 accepts IR <= 13, opset <= 26; Gelu needs >= 20).
 */

import { headDim, type ModelConfig } from "../../model/config.ts";
import { parameterSpecs } from "../../model/weights.ts";
import { ElemType, encodeModel, type AttrValue, type NodeDef, type TensorDef, type ValueInfoDef } from "./onnx-proto.ts";

export const IR_VERSION = 10;
export const OPSET = 21;
/** Finite, not -inf: a fully masked row must not become NaN (softmax over all -inf is NaN). */
const MASK_VALUE = -1e9;

class GraphBuilder {
  readonly nodes: NodeDef[] = [];
  readonly initializers: TensorDef[] = [];
  private counter = 0;
  private constants = new Map<string, string>();

  node(opType: string, inputs: string[], attributes: Record<string, AttrValue> = {}, outputName?: string): string {
    const out = outputName ?? `${opType.toLowerCase()}_${this.counter++}`;
    this.nodes.push({ opType, inputs, outputs: [out], name: `n${this.nodes.length}_${opType}`, attributes });
    return out;
  }

  /** An int64 constant (1-D, or a scalar when `scalar`), deduplicated by value. */
  int64(values: number[], scalar = false): string {
    const key = `i64:${scalar}:${values.join(",")}`;
    const existing = this.constants.get(key);
    if (existing) return existing;
    const raw = new Uint8Array(values.length * 8);
    const view = new DataView(raw.buffer);
    values.forEach((v, i) => view.setBigInt64(i * 8, BigInt(v), true));
    const name = `const_${this.constants.size}`;
    this.initializers.push({ name, dims: scalar ? [] : [values.length], dataType: ElemType.INT64, raw });
    this.constants.set(key, name);
    return name;
  }

  /** A float32 scalar constant. */
  float(value: number): string {
    const key = `f32:${value}`;
    const existing = this.constants.get(key);
    if (existing) return existing;
    const raw = new Uint8Array(4);
    new DataView(raw.buffer).setFloat32(0, value, true);
    const name = `const_${this.constants.size}`;
    this.initializers.push({ name, dims: [], dataType: ElemType.FLOAT, raw });
    this.constants.set(key, name);
    return name;
  }

  linear(x: string, w: string, b: string | null): string {
    const y = this.node("MatMul", [x, w]);
    return b ? this.node("Add", [y, b]) : y;
  }

  layerNorm(x: string, prefix: string, eps: number): string {
    return this.node("LayerNormalization", [x, `${prefix}.weight`, `${prefix}.bias`], {
      axis: { kind: "int", value: -1 },
      epsilon: { kind: "float", value: eps },
    });
  }

  /** Residual MLP half of a block: x + W2 gelu(W1 LN(x) + b1) + b2. */
  mlp(x: string, l: number, eps: number): string {
    const p = `blocks.${l}.`;
    const h = this.layerNorm(x, `${p}ln2`, eps);
    const fc = this.linear(h, `${p}mlp.fc.weight`, `${p}mlp.fc.bias`);
    const act = this.node("Gelu", [fc], { approximate: { kind: "string", value: "tanh" } });
    return this.node("Add", [x, this.linear(act, `${p}mlp.proj.weight`, `${p}mlp.proj.bias`)]);
  }
}

function weightInputs(config: ModelConfig): ValueInfoDef[] {
  return parameterSpecs(config).map((s) => ({ name: s.name, elemType: ElemType.FLOAT, dims: s.shape }));
}

function finish(g: GraphBuilder, name: string, inputs: ValueInfoDef[], outputs: ValueInfoDef[]): Uint8Array {
  return encodeModel({
    irVersion: IR_VERSION,
    opsetVersion: OPSET,
    producer: "rlq",
    graphName: name,
    nodes: g.nodes,
    inputs,
    outputs,
    initializers: g.initializers,
  });
}

/**
 * Prefill graph.
 * Inputs: `input_ids` [B, T] int32, weights.
 * Outputs: `logits` [B, T, V] float32; `present.{l}.key|value` [B, H, T, hd] float32.
 */
export function buildPrefillModel(config: ModelConfig): Uint8Array {
  const g = new GraphBuilder();
  const { d_model: d, n_heads: nh, layer_norm_eps: eps } = config;
  const hd = headDim(config);
  const seqLen = g.node("Squeeze", [g.node("Shape", ["input_ids"], { start: { kind: "int", value: 1 }, end: { kind: "int", value: 2 } })]);
  const positions = g.node("Range", [g.int64([0], true), seqLen, g.int64([1], true)]); // [T] int64
  let x = g.node("Add", [g.node("Gather", ["tok_emb.weight", "input_ids"]), g.node("Gather", ["pos_emb.weight", positions])]); // [B,T,D]
  // causal[t, s] = s <= t, as an additive bias [T, T].
  const causal = g.node("LessOrEqual", [g.node("Unsqueeze", [positions, g.int64([0])]), g.node("Unsqueeze", [positions, g.int64([1])])]);
  const bias = g.node("Where", [causal, g.float(0), g.float(MASK_VALUE)]);
  const outputs: ValueInfoDef[] = [{ name: "logits", elemType: ElemType.FLOAT, dims: ["batch", "seq", config.vocab_size] }];
  for (let l = 0; l < config.n_layers; l++) {
    const p = `blocks.${l}.`;
    const qkv = g.linear(g.layerNorm(x, `${p}ln1`, eps), `${p}attn.qkv.weight`, `${p}attn.qkv.bias`); // [B,T,3D]
    const split = g.node("Transpose", [g.node("Reshape", [qkv, g.int64([0, 0, 3, nh, hd])])], { perm: { kind: "ints", value: [2, 0, 3, 1, 4] } }); // [3,B,H,T,hd]
    const q = g.node("Gather", [split, g.int64([0], true)], { axis: { kind: "int", value: 0 } });
    const k = g.node("Gather", [split, g.int64([1], true)], { axis: { kind: "int", value: 0 } }, `present.${l}.key`);
    const v = g.node("Gather", [split, g.int64([2], true)], { axis: { kind: "int", value: 0 } }, `present.${l}.value`);
    const kt = g.node("Transpose", [k], { perm: { kind: "ints", value: [0, 1, 3, 2] } });
    const scores = g.node("Add", [g.node("Mul", [g.node("MatMul", [q, kt]), g.float(1 / Math.sqrt(hd))]), bias]); // [B,H,T,T]
    const probs = g.node("Softmax", [scores], { axis: { kind: "int", value: -1 } });
    const heads = g.node("Transpose", [g.node("MatMul", [probs, v])], { perm: { kind: "ints", value: [0, 2, 1, 3] } }); // [B,T,H,hd]
    const attn = g.linear(g.node("Reshape", [heads, g.int64([0, 0, d])]), `${p}attn.proj.weight`, `${p}attn.proj.bias`);
    x = g.mlp(g.node("Add", [x, attn]), l, eps);
    for (const kind of ["key", "value"]) outputs.push({ name: `present.${l}.${kind}`, elemType: ElemType.FLOAT, dims: ["batch", nh, "seq", hd] });
  }
  g.linear(g.layerNorm(x, "ln_f", eps), "head.weight", null);
  const last = g.nodes[g.nodes.length - 1] as NodeDef;
  last.outputs = ["logits"];
  const inputs: ValueInfoDef[] = [{ name: "input_ids", elemType: ElemType.INT32, dims: ["batch", "seq"] }, ...weightInputs(config)];
  return finish(g, "rlq_prefill", inputs, outputs);
}

/**
 * Decode graph: one token per row.
 * Inputs: `input_ids` [B] int32; `positions` [B] int32 (the new token's position =
 * the number of cached tokens; also its cache slot); `past.{l}.key|value`
 * [B, H, S, hd] float32 (slots >= position are ignored); weights.
 * Outputs: `logits` [B, V]; `new.{l}.key|value` [B, H, 1, hd] to store at slot `position`.
 */
export function buildDecodeModel(config: ModelConfig): Uint8Array {
  const g = new GraphBuilder();
  const { d_model: d, n_heads: nh, layer_norm_eps: eps } = config;
  const hd = headDim(config);
  let x = g.node("Add", [g.node("Gather", ["tok_emb.weight", "input_ids"]), g.node("Gather", ["pos_emb.weight", "positions"])]); // [B,D]
  const cacheLen = g.node("Squeeze", [g.node("Shape", ["past.0.key"], { start: { kind: "int", value: 2 }, end: { kind: "int", value: 3 } })]);
  const slots = g.node("Range", [g.int64([0], true), cacheLen, g.int64([1], true)]); // [S] int64
  const pos = g.node("Reshape", [g.node("Cast", ["positions"], { to: { kind: "int", value: ElemType.INT64 } }), g.int64([-1, 1, 1, 1])]); // [B,1,1,1]
  const isNew = g.node("Equal", [slots, pos]); // [B,1,1,S]
  const allowed = g.node("LessOrEqual", [slots, pos]); // [B,1,1,S]
  const zero = g.float(0);
  const outputs: ValueInfoDef[] = [{ name: "logits", elemType: ElemType.FLOAT, dims: ["batch", config.vocab_size] }];
  const inputs: ValueInfoDef[] = [
    { name: "input_ids", elemType: ElemType.INT32, dims: ["batch"] },
    { name: "positions", elemType: ElemType.INT32, dims: ["batch"] },
  ];
  for (let l = 0; l < config.n_layers; l++) {
    const p = `blocks.${l}.`;
    const pastK = `past.${l}.key`;
    const pastV = `past.${l}.value`;
    inputs.push(
      { name: pastK, elemType: ElemType.FLOAT, dims: ["batch", nh, "cache", hd] },
      { name: pastV, elemType: ElemType.FLOAT, dims: ["batch", nh, "cache", hd] },
    );
    const qkv = g.linear(g.layerNorm(x, `${p}ln1`, eps), `${p}attn.qkv.weight`, `${p}attn.qkv.bias`); // [B,3D]
    const split = g.node("Transpose", [g.node("Reshape", [qkv, g.int64([0, 3, nh, 1, hd])])], { perm: { kind: "ints", value: [1, 0, 2, 3, 4] } }); // [3,B,H,1,hd]
    const q = g.node("Gather", [split, g.int64([0], true)], { axis: { kind: "int", value: 0 } });
    const k = g.node("Gather", [split, g.int64([1], true)], { axis: { kind: "int", value: 0 } }, `new.${l}.key`);
    const v = g.node("Gather", [split, g.int64([2], true)], { axis: { kind: "int", value: 0 } }, `new.${l}.value`);
    const cacheScores = g.node("MatMul", [q, g.node("Transpose", [pastK], { perm: { kind: "ints", value: [0, 1, 3, 2] } })]); // [B,H,1,S]
    const newScore = g.node("ReduceSum", [g.node("Mul", [q, k]), g.int64([-1])], { keepdims: { kind: "int", value: 1 } }); // [B,H,1,1]
    const scores = g.node("Mul", [g.node("Where", [isNew, newScore, cacheScores]), g.float(1 / Math.sqrt(hd))]);
    const probs = g.node("Softmax", [g.node("Where", [allowed, scores, g.float(MASK_VALUE)])], { axis: { kind: "int", value: -1 } });
    const pNew = g.node("ReduceSum", [g.node("Where", [isNew, probs, zero]), g.int64([-1])], { keepdims: { kind: "int", value: 1 } }); // [B,H,1,1]
    const heads = g.node("Add", [g.node("MatMul", [g.node("Where", [isNew, zero, probs]), pastV]), g.node("Mul", [pNew, v])]); // [B,H,1,hd]
    const attn = g.linear(g.node("Reshape", [heads, g.int64([0, d])]), `${p}attn.proj.weight`, `${p}attn.proj.bias`);
    x = g.mlp(g.node("Add", [x, attn]), l, eps);
    for (const kind of ["key", "value"]) outputs.push({ name: `new.${l}.${kind}`, elemType: ElemType.FLOAT, dims: ["batch", nh, 1, hd] });
  }
  g.linear(g.layerNorm(x, "ln_f", eps), "head.weight", null);
  const last = g.nodes[g.nodes.length - 1] as NodeDef;
  last.outputs = ["logits"];
  return finish(g, "rlq_decode", [...inputs, ...weightInputs(config)], outputs);
}
