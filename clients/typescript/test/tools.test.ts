// A live tool call through generate, against a `hyserve serve` whose chat template renders tools
// (tests/test_generated_clients.py starts one on the tiny hybrid model with a Qwen3.5-style template
// and sets HYSERVE_TOOLS_TARGET). Without HYSERVE_TOOLS_TARGET this test is skipped.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  FinishReason,
  HyserveClient,
  chatRequest,
  type Finished,
  type MessageSpec,
  type ToolCall,
  type ToolCallDelta,
} from "../src/index.js";

const target = process.env.HYSERVE_TOOLS_TARGET ?? "";
const skip = target === "" ? "HYSERVE_TOOLS_TARGET not set (tests/test_generated_clients.py runs this)" : false;

const CITIES = ["Oslo", "Lima"];
const weather = {
  name: "get_weather",
  description: "Current weather of a city",
  parameters: {
    type: "object",
    properties: { city: { type: "string", enum: CITIES } },
    required: ["city"],
  },
};

/** Runs one required get_weather call and checks it; returns the call. */
async function requireWeatherCall(client: HyserveClient, messages: MessageSpec[]): Promise<ToolCall> {
  const request = chatRequest(messages, {
    maxTokens: 96,
    tools: [weather],
    toolChoice: "required",
    parallelToolCalls: false,
    chatTemplateKwargs: { enable_thinking: false },
  });
  const pieces: ToolCallDelta[] = [];
  let finished: Finished | undefined;
  for await (const event of client.generate(request, { sessionId: "ts-tools-test" })) {
    if (event.event.case === "delta") {
      pieces.push(...event.event.value.toolCalls);
    } else if (event.event.case === "finished") {
      finished = event.event.value;
    }
  }
  assert.ok(finished !== undefined, "no Finished event");
  assert.equal(finished.reason, FinishReason.TOOL_CALLS, `finished ${FinishReason[finished.reason]}`);
  assert.equal(finished.toolCalls.length, 1, `calls ${JSON.stringify(finished.toolCalls)}`);
  const call = finished.toolCalls[0];
  assert.equal(call.name, "get_weather");
  assert.ok(call.id !== "", "the call has no id");
  let args: { city?: unknown };
  try {
    args = JSON.parse(call.argumentsJson);
  } catch (error) {
    assert.fail(`arguments ${JSON.stringify(call.argumentsJson)} are not JSON: ${error}`);
  }
  assert.ok(CITIES.includes(String(args.city)), `arguments ${call.argumentsJson}: city not in ${CITIES}`);
  assert.ok(pieces.length > 0, "no ToolCallDelta was streamed");
  assert.equal(pieces[0].id, call.id);
  assert.equal(pieces[0].name, call.name);
  assert.ok(
    pieces.every((p) => p.index === 0),
    "a piece of a second call",
  );
  assert.equal(pieces.map((p) => p.argumentsFragment).join(""), call.argumentsJson);
  return call;
}

test("a required tool call and a second turn with its result", { skip }, async () => {
  const client = new HyserveClient(target);
  const messages: MessageSpec[] = [{ role: "user", content: "What is the weather in Oslo?" }];
  const call = await requireWeatherCall(client, messages);
  messages.push(
    { role: "assistant", content: "", toolCalls: [call] },
    { role: "tool", content: JSON.stringify({ tempC: 21, sky: "clear" }), toolCallId: call.id },
  );
  await requireWeatherCall(client, messages);
});
