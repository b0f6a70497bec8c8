// GET /v1/models and /v1/models/:id: the one model this server holds.
import { Type } from "@fastify/type-provider-typebox";

import type { App } from "../app.js";
import type { ServerContext } from "../context.js";
import { ApiError } from "../errors.js";

export function registerModelsRoutes(app: App, ctx: ServerContext): void {
  const card = () => ({ id: ctx.modelId, object: "model", created: ctx.created, owned_by: "a2d" });
  app.get("/v1/models", async () => ({ object: "list", data: [card()] }));
  app.get("/v1/models/:id", { schema: { params: Type.Object({ id: Type.String() }) } }, async (request) => {
    if (request.params.id !== ctx.modelId) {
      throw new ApiError("model_not_found", `The model '${request.params.id}' does not exist; this server holds '${ctx.modelId}'.`, "model");
    }
    return card();
  });
}
