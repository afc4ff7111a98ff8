// Building GenerateRequest messages from plain options: output constraints, tools, tool choice and
// tool-call messages. OpenAI-shaped tools, tool choices and tool calls are accepted as they are.
import type { JsonObject, MessageInitShape } from "@bufbuild/protobuf";

import type { GenerateRequestInit } from "./client.js";
import {
  ToolChoiceMode,
  type ChatMessageSchema,
  type ConstraintSchema,
  type SamplingParamsSchema,
  type StoppingCriteriaSchema,
  type ToolCallSchema,
  type ToolChoiceSchema,
  type ToolSchema,
} from "./gen/hyserve/v1/hyserve_pb.js";

/** The output's language: exactly one kind. A JSON Schema may be given as an object or JSON text. */
export type ConstraintSpec =
  | { jsonSchema: JsonObject | string }
  | { jsonObject: true }
  | { regex: string }
  | { grammar: string };

/** A function the model may call: flat, or OpenAI's { type: "function", function: {...} }. */
export type ToolSpec =
  | { name: string; description?: string; parameters?: JsonObject | string }
  | { type: "function"; function: { name: string; description?: string; parameters?: JsonObject | string } };

/** A mode, or the one function the model must call ({ function: name }, or OpenAI's shape). */
export type ToolChoiceSpec =
  | "auto"
  | "none"
  | "required"
  | { function: string }
  | { type: "function"; function: { name: string } };

/** A call an assistant turn made: hyserve's ToolCall, or OpenAI's shape (arguments as JSON text or object). */
export type ToolCallSpec =
  | { id: string; name: string; argumentsJson?: string }
  | { id: string; type: "function"; function: { name: string; arguments: string | JsonObject } };

/** One chat turn. toolCalls: the calls an assistant turn made; toolCallId: the call a "tool" turn answers. */
export interface MessageSpec {
  role: string;
  content?: string | null;
  name?: string;
  reasoningContent?: string;
  toolCalls?: ToolCallSpec[];
  toolCallId?: string;
}

/** Sampling settings (SamplingParams less its constraint); unset ones take the server's defaults. */
export interface SamplingOptions {
  temperature?: number;
  topK?: number;
  topP?: number;
  minP?: number;
  repetitionPenalty?: number;
  presencePenalty?: number;
  frequencyPenalty?: number;
  seed?: bigint;
}

export interface RequestOptions {
  taskId?: string;
  maxTokens?: number;
  stop?: string[];
  sampling?: SamplingOptions;
  /** Restrict the output to a JSON Schema, any JSON object, a regex or a Lark grammar. */
  constraint?: ConstraintSpec;
}

export interface ChatOptions extends RequestOptions {
  /** Functions the model may call; its calls come back in Delta.toolCalls and Finished.toolCalls. */
  tools?: ToolSpec[];
  toolChoice?: ToolChoiceSpec;
  /** Allow several calls in one answer. Unset: true. */
  parallelToolCalls?: boolean;
  /** Split reasoning and tool calls out of Delta.text. Unset: true. */
  parseOutput?: boolean;
  addGenerationPrompt?: boolean;
  chatTemplateKwargs?: JsonObject;
}

function jsonText(value: JsonObject | string | undefined): string {
  if (value === undefined) {
    return "";
  }
  return typeof value === "string" ? value : JSON.stringify(value);
}

/** The Constraint message of a spec; throws unless exactly one kind is given. */
export function constraint(spec: ConstraintSpec): MessageInitShape<typeof ConstraintSchema> {
  const kinds = Object.keys(spec);
  if (kinds.length !== 1) {
    throw new TypeError(`give exactly one constraint kind (got ${kinds.join(", ") || "none"})`);
  }
  if ("jsonSchema" in spec) {
    return { kind: { case: "jsonSchema", value: jsonText(spec.jsonSchema) } };
  }
  if ("jsonObject" in spec) {
    return { kind: { case: "jsonObject", value: true } };
  }
  if ("regex" in spec) {
    return { kind: { case: "regex", value: spec.regex } };
  }
  return { kind: { case: "grammar", value: spec.grammar } };
}

export function tool(spec: ToolSpec): MessageInitShape<typeof ToolSchema> {
  const f = "function" in spec ? spec.function : spec;
  return { name: f.name, description: f.description ?? "", parametersJson: jsonText(f.parameters) };
}

export function toolChoice(spec: ToolChoiceSpec): MessageInitShape<typeof ToolChoiceSchema> {
  switch (spec) {
    case "auto":
      return { choice: { case: "mode", value: ToolChoiceMode.AUTO } };
    case "none":
      return { choice: { case: "mode", value: ToolChoiceMode.NONE } };
    case "required":
      return { choice: { case: "mode", value: ToolChoiceMode.REQUIRED } };
  }
  if (typeof spec !== "object" || spec === null) {
    throw new TypeError(`toolChoice must be "auto", "none", "required" or { function: name }, got ${String(spec)}`);
  }
  const name = typeof spec.function === "string" ? spec.function : spec.function.name;
  return { choice: { case: "function", value: name } };
}

export function toolCall(spec: ToolCallSpec): MessageInitShape<typeof ToolCallSchema> {
  if ("function" in spec) {
    return { id: spec.id, name: spec.function.name, argumentsJson: jsonText(spec.function.arguments) };
  }
  return { id: spec.id, name: spec.name, argumentsJson: spec.argumentsJson ?? "" };
}

export function message(spec: MessageSpec): MessageInitShape<typeof ChatMessageSchema> {
  return {
    role: spec.role,
    content: spec.content ?? "",
    name: spec.name,
    reasoningContent: spec.reasoningContent,
    toolCalls: (spec.toolCalls ?? []).map(toolCall),
    toolCallId: spec.toolCallId,
  };
}

interface Common {
  taskId?: string;
  sampling?: MessageInitShape<typeof SamplingParamsSchema>;
  stopping?: MessageInitShape<typeof StoppingCriteriaSchema>;
}

function common(options: RequestOptions): Common {
  const out: Common = { taskId: options.taskId };
  if (options.sampling !== undefined || options.constraint !== undefined) {
    out.sampling = { ...options.sampling };
    if (options.constraint !== undefined) {
      out.sampling.constraint = constraint(options.constraint);
    }
  }
  if (options.maxTokens !== undefined || options.stop !== undefined) {
    out.stopping = { maxTokens: options.maxTokens, stopStrings: options.stop };
  }
  return out;
}

/**
 * A plain-text request, e.g.
 * textRequest("The capital of France is", { maxTokens: 16, constraint: { regex: "[A-Z][a-z]+" } }).
 */
export function textRequest(prompt: string, options: RequestOptions = {}): GenerateRequestInit {
  return { ...common(options), input: { case: "text", value: { text: prompt } } };
}

/** A chat request, rendered with the model's chat template, optionally with tools. */
export function chatRequest(messages: MessageSpec[], options: ChatOptions = {}): GenerateRequestInit {
  const chat = {
    messages: messages.map(message),
    tools: (options.tools ?? []).map(tool),
    toolChoice: options.toolChoice === undefined ? undefined : toolChoice(options.toolChoice),
    parallelToolCalls: options.parallelToolCalls,
    parseOutput: options.parseOutput,
    addGenerationPrompt: options.addGenerationPrompt,
    chatTemplateKwargs: options.chatTemplateKwargs,
  };
  return { ...common(options), input: { case: "chat", value: chat } };
}
