export * from "./client.js";
export * from "./gen/hyserve/v1/hyserve_pb.js";
export { Code } from "@connectrpc/connect";
export * from "./requests.js";
