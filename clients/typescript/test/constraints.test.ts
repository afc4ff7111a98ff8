// Live tests of output constraints against a running `hyserve serve` (HYSERVE_TARGET; see
// live.test.ts); tests/test_generated_clients.py runs them. Without HYSERVE_TARGET they are skipped.
import assert from "node:assert/strict";
import { test } from "node:test";

import { FinishReason, HyserveClient, textRequest } from "../src/index.js";

const target = process.env.HYSERVE_TARGET ?? "";
const skip = target === "" ? "HYSERVE_TARGET not set (tests/test_generated_clients.py runs these)" : false;

test("a JSON Schema constraint gives JSON", { skip }, async () => {
  // one short object, so that the answer ends well before maxTokens
  const schema = {
    type: "object",
    properties: { capital: { type: "string", enum: ["Paris", "Rome", "Berlin"] } },
    required: ["capital"],
    additionalProperties: false,
  };
  const request = textRequest("The capital of France, as JSON:", { maxTokens: 48, constraint: { jsonSchema: schema } });
  const { text, finished } = await new HyserveClient(target).generateText(request, { sessionId: "ts-live-test" });
  let answer: { capital?: unknown };
  try {
    answer = JSON.parse(text);
  } catch (error) {
    assert.fail(`output ${JSON.stringify(text)} (${FinishReason[finished.reason]}) is not JSON: ${error}`);
  }
  assert.ok(["Paris", "Rome", "Berlin"].includes(String(answer.capital)), `output ${text} does not match the schema`);
});
