import { describe, expect, it } from "vitest";
import { generateTokensBody, generateTokensRequestId } from "./vllm-generate-tokens.ts";
import { OpenAiCompatServer } from "./openai-compat.ts";
import type { GenerateRequest } from "./engine.ts";

/** The server's body for an image request, exposed as the engine builds it. */
class BodyOf extends OpenAiCompatServer {
  tokensBody(req: GenerateRequest): Record<string, unknown> {
    return generateTokensBody(req, this.body(req, true, { max_tokens: 7 }));
  }
  abortId(requestId: string): string {
    return this.externalRequestId(requestId);
  }
}

const png = "data:image/png;base64,iVBORw0KGgo=";
const req: GenerateRequest = {
  requestId: "r-1-0-0",
  inputIds: [258, 259, 261, 260, 65],
  sampling: { temperature: 1, topP: 1, topK: -1, maxNewTokens: 16, stopTokenIds: [258], seed: 5 },
  imageData: [png, "data:image/jpeg;base64,/9j/"],
};

describe("vLLM /inference/v1/generate body (token_in_token_out/protocol.py GenerateRequest)", () => {
  it("sends rlq's token ids as they are, the images as image_url content parts in placeholder order, the sampling under sampling_params", () => {
    const engine = new BodyOf({ url: "http://127.0.0.1:1/v1", model: "m", requestTimeoutMs: 1000, hasImages: true });
    expect(engine.tokensBody(req)).toEqual({
      request_id: "r-1-0-0",
      token_ids: [258, 259, 261, 260, 65],
      model: "m",
      content_parts: [
        { type: "image_url", url: png },
        { type: "image_url", url: "data:image/jpeg;base64,/9j/" },
      ],
      sampling_params: {
        max_tokens: 7,
        temperature: 1,
        top_p: 1,
        top_k: -1,
        seed: 5,
        stop_token_ids: [258],
        include_stop_str_in_output: true,
        skip_special_tokens: false,
        spaces_between_special_tokens: false,
        logprobs: 1,
      },
      stream: true,
      output_mode: "tokens",
    });
    // serving.py serve_tokens prefixes the id it was given: /abort_requests takes that one.
    expect(engine.abortId("r-1-0-0")).toBe(generateTokensRequestId("r-1-0-0"));
    expect(engine.abortId("r-1-0-0")).toBe("generate-tokens-r-1-0-0");
  });

  it("a text request has no content_parts; an engine without images keeps /v1/completions' abort id", () => {
    const { imageData: _, ...text } = req;
    const engine = new BodyOf({ url: "http://127.0.0.1:1", model: "m", requestTimeoutMs: 1000 });
    expect(engine.tokensBody(text)).not.toHaveProperty("content_parts");
    expect(engine.abortId("r")).toBe("cmpl-r-0");
  });

  it("an image request on an engine that sends /v1/completions is refused before anything is sent", async () => {
    const engine = new OpenAiCompatServer({ url: "http://127.0.0.1:1", model: "m", requestTimeoutMs: 1000 });
    await expect(engine.generate(req)).rejects.toThrow(/2 image\(s\) .*\/v1\/completions, which takes none.*multimodal_keys/);
  });
});
