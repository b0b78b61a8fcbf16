// The gRPC client (import from "deepx-flow/grpc"): the same calls and answers as Client.
import type { Client } from "./index.js";

export declare class GrpcClient implements Client {
  constructor(address?: string, options?: { token?: string; credentials?: unknown; pollSeconds?: number });
  close(): void;
  capabilities: Client["capabilities"];
  checkServer: Client["checkServer"];
  analyze: Client["analyze"];
  execute: Client["execute"];
  operation: Client["operation"];
  cancel: Client["cancel"];
  runs: Client["runs"];
  run: Client["run"];
  defineAsset: Client["defineAsset"];
  assets: Client["assets"];
  assetVersions: Client["assetVersions"];
  materialize: Client["materialize"];
  readAsset: Client["readAsset"];
  infer: Client["infer"];
}
