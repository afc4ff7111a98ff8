// Request building, without a server.
import assert from "node:assert/strict";
import { test } from "node:test";

import { create } from "@bufbuild/protobuf";

import {
  GenerateRequestSchema,
  ToolChoiceMode,
  chatRequest,
  constraint,
  textRequest,
  toolChoice,
  type ConstraintSpec,
} from "../src/index.js";

const weatherSchema = { type: "object", properties: { city: { type: "string" } }, required: ["city"] };

test("text requests with a constraint", () => {
  const req = create(
    GenerateRequestSchema,
    textRequest("x", { maxTokens: 8, sampling: { temperature: 0.5 }, constraint: { jsonSchema: weatherSchema } }),
  );
  assert.equal(req.input.case, "text");
  assert.equal(req.stopping?.maxTokens, 8);
  assert.equal(req.sampling?.temperature, 0.5);
  assert.equal(req.sampling?.constraint?.kind.case, "jsonSchema");
  assert.deepEqual(JSON.parse(String(req.sampling?.constraint?.kind.value)), weatherSchema);
  const integer = '{"type": "integer"}';
  assert.deepEqual(constraint({ jsonSchema: integer }).kind, { case: "jsonSchema", value: integer });
  assert.deepEqual(constraint({ jsonObject: true }).kind, { case: "jsonObject", value: true });
  assert.deepEqual(constraint({ regex: "[0-9]+" }).kind, { case: "regex", value: "[0-9]+" });
  assert.deepEqual(constraint({ grammar: 'start: "yes"' }).kind, { case: "grammar", value: 'start: "yes"' });
  assert.throws(() => constraint({ regex: "a", grammar: "b" } as unknown as ConstraintSpec), TypeError);
  const plain = create(GenerateRequestSchema, textRequest("x"));
  assert.equal(plain.sampling, undefined);
  assert.equal(plain.stopping, undefined);
});

test("chat requests with tools and tool-call messages", () => {
  const req = create(
    GenerateRequestSchema,
    chatRequest(
      [
        { role: "user", content: "Weather in Paris?" },
        { role: "assistant", toolCalls: [{ id: "call_1", name: "get_weather", argumentsJson: '{"city": "Paris"}' }] },
        { role: "tool", content: '{"temp_c": 21}', toolCallId: "call_1" },
        {
          role: "assistant",
          content: null,
          toolCalls: [
            { id: "call_2", type: "function", function: { name: "get_weather", arguments: { city: "Nice" } } },
          ],
        },
      ],
      {
        maxTokens: 64,
        tools: [
          {
            type: "function",
            function: { name: "get_weather", description: "Weather of a city", parameters: weatherSchema },
          },
          { name: "get_time" },
        ],
        toolChoice: { function: "get_weather" },
        parallelToolCalls: false,
        parseOutput: true,
        chatTemplateKwargs: { enable_thinking: false },
      },
    ),
  );
  assert.equal(req.input.case, "chat");
  const chat = req.input.value!;
  assert.deepEqual(
    chat.tools.map((t) => [t.name, t.description, t.parametersJson === "" ? "" : JSON.parse(t.parametersJson)]),
    [
      ["get_weather", "Weather of a city", weatherSchema],
      ["get_time", "", ""],
    ],
  );
  assert.deepEqual(chat.toolChoice?.choice, { case: "function", value: "get_weather" });
  assert.equal(chat.parallelToolCalls, false);
  assert.equal(chat.parseOutput, true);
  assert.deepEqual(chat.chatTemplateKwargs, { enable_thinking: false });
  const [, assistant, toolTurn, second] = chat.messages;
  assert.equal(assistant.content, "");
  assert.deepEqual(
    assistant.toolCalls.map((c) => [c.id, c.name, c.argumentsJson]),
    [["call_1", "get_weather", '{"city": "Paris"}']],
  );
  assert.equal(assistant.toolCallId, undefined);
  assert.equal(toolTurn.toolCallId, "call_1");
  assert.deepEqual(JSON.parse(second.toolCalls[0].argumentsJson), { city: "Nice" });

  assert.deepEqual(toolChoice("required").choice, { case: "mode", value: ToolChoiceMode.REQUIRED });
  assert.deepEqual(toolChoice("none").choice, { case: "mode", value: ToolChoiceMode.NONE });
  assert.deepEqual(toolChoice({ type: "function", function: { name: "f" } }).choice, { case: "function", value: "f" });
  const plain = create(GenerateRequestSchema, chatRequest([{ role: "user", content: "x" }]));
  assert.ok(plain.input.case === "chat");
  assert.equal(plain.input.value.toolChoice, undefined);
  assert.equal(plain.input.value.parseOutput, undefined);
});
