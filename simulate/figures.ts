// The GPU start-up figures (docs/cold-start.md, "The figures"): read from the last ```a2d-startup-figures
// block of bench/NOTES.md, or conservative estimates when there is none, and turned into predicted phases
// for a target card and a folder's model.
import { readFile } from "node:fs/promises";

export type GpuName = "h100" | "h200";
/** measured here, predicted from measured figures, estimated, or given by the user (--disk-mbps). */
export type PhaseKind = "measured" | "predicted" | "estimate" | "given";

export interface CardFigures {
  gpu: string;
  hbm_TBps: number;
  command: string;
  model: { num_layers: number; weight_bytes: number };
  context_s: number;
  upload_GBps: number;
  graph_capture_s: number;
  warmup_s: number;
  ready_s?: number;
}

export interface FiguresFile {
  schema: 1;
  cards: Partial<Record<GpuName, CardFigures>>;
}

export class FiguresError extends Error {}

/** Memory bandwidth of the target cards (SXM parts), to scale a warm-up measured on one card to another. */
export const HBM_TBPS: Record<GpuName, number> = { h100: 3.35, h200: 4.8 };

/** Used only when there are no measured figures; docs/cold-start.md gives the reasoning for each. */
export const ESTIMATES: CardFigures = {
  gpu: "no measurement (conservative estimates)",
  hbm_TBps: HBM_TBPS.h100,
  command: "none: docs/cold-start.md, 'Until there are figures'",
  // Per layer and per 5 GB of weights: the predictions scale these to the folder's model.
  model: { num_layers: 1, weight_bytes: 5e9 },
  context_s: 5,
  upload_GBps: 3,
  graph_capture_s: 0.25,
  warmup_s: 5,
};

const NUMBER_FIELDS = ["hbm_TBps", "context_s", "upload_GBps", "graph_capture_s", "warmup_s"] as const;

function checkCard(name: string, card: unknown, source: string): CardFigures {
  const c = card as Partial<CardFigures>;
  for (const field of NUMBER_FIELDS) {
    if (typeof c?.[field] !== "number" || !Number.isFinite(c[field]) || c[field] < 0) {
      throw new FiguresError(`${source}: cards.${name}.${field} must be a non-negative number (docs/cold-start.md lists the fields)`);
    }
  }
  if (!(c.upload_GBps! > 0) || !(c.hbm_TBps! > 0)) throw new FiguresError(`${source}: cards.${name}: upload_GBps and hbm_TBps must be above 0`);
  if (typeof c.model?.num_layers !== "number" || typeof c.model?.weight_bytes !== "number" || c.model.num_layers <= 0 || c.model.weight_bytes <= 0) {
    throw new FiguresError(`${source}: cards.${name}.model needs num_layers and weight_bytes above 0`);
  }
  return c as CardFigures;
}

export function parseFigures(markdown: string, source: string): FiguresFile | null {
  const blocks = [...markdown.matchAll(/^```a2d-startup-figures[ \t]*\n([\s\S]*?)^```/gm)];
  const last = blocks[blocks.length - 1];
  if (!last) return null;
  let parsed: FiguresFile;
  try {
    parsed = JSON.parse(last[1]!) as FiguresFile;
  } catch (error) {
    throw new FiguresError(`${source}: the a2d-startup-figures block is not valid JSON (${(error as Error).message})`);
  }
  if (parsed.schema !== 1 || typeof parsed.cards !== "object" || parsed.cards === null) {
    throw new FiguresError(`${source}: the a2d-startup-figures block must have "schema": 1 and "cards"`);
  }
  for (const [name, card] of Object.entries(parsed.cards)) parsed.cards[name as GpuName] = checkCard(name, card, source);
  return parsed;
}

export interface FigureSource {
  card: CardFigures;
  kind: PhaseKind;
  description: string;
  /** The figures were measured on the target card itself (not scaled from another). */
  ownCard: boolean;
}

export async function loadFigures(path: string, gpu: GpuName): Promise<FigureSource> {
  let text: string | null = null;
  try {
    text = await readFile(path, "utf8");
  } catch {
    // no notes yet: estimates below
  }
  const figures = text === null ? null : parseFigures(text, path);
  const own = figures?.cards[gpu];
  if (own) return { card: own, kind: "predicted", ownCard: true, description: `${path} (measured on ${own.gpu})` };
  const other = figures && Object.values(figures.cards)[0];
  if (other) {
    return { card: other, kind: "predicted", ownCard: false, description: `${path} (measured on ${other.gpu}; no ${gpu} entry, warm-up scaled by memory bandwidth)` };
  }
  return {
    card: { ...ESTIMATES, hbm_TBps: HBM_TBPS[gpu] },
    kind: "estimate",
    ownCard: false,
    description: `no a2d-startup-figures block in ${path}: CONSERVATIVE ESTIMATES, not measurements (docs/cold-start.md)`,
  };
}

/**
 * How far a predicted phase may land from its figure, as factors on it: the prediction's range is the sum
 * of every phase at its low factor to the sum at its high one. Each says why (docs/cold-start.md, "The
 * range").
 */
export interface Spread {
  low: number;
  high: number;
  why: string;
}

/** Figures measured on the target card itself: the 2B start on the H200 came in at 4.1 s against 4.8 s predicted. */
const SAME_CARD: Spread = { low: 0.8, high: 1.25, why: "measured on this card (the 2B start on the H200: 4.1 s measured, 4.8 s predicted)" };
/** Figures of another card: what depends on the host (driver, PCIe, host memory) does not scale with the card. */
const OTHER_CARD: Record<string, Spread> = {
  "cuda context": { low: 0.7, high: 1.5, why: "measured on another card; the driver and host set it, not the card" },
  "weights upload": { low: 0.5, high: 1.5, why: "measured on another card's host; PCIe and host memory set it (a Gen4 host is half a Gen5 one)" },
  "graph capture": { low: 0.7, high: 1.5, why: "measured on another card; launch overhead, host-bound" },
  "warm-up": { low: 0.7, high: 1.5, why: "measured on another card, scaled by memory bandwidth" },
};
/** The estimates are built as upper bounds (docs/cold-start.md, "Until there are figures"). */
const ESTIMATE: Spread = { low: 0.1, high: 1, why: "a conservative estimate, an upper bound by construction" };

export interface PredictedPhase {
  name: string;
  seconds: number;
  kind: PhaseKind;
  spread: Spread;
}

export function predictGpuPhases(source: FigureSource, gpu: GpuName, weightBytes: number, numLayers: number): PredictedPhase[] {
  const { card, kind } = source;
  const spread = (name: string) => (kind === "estimate" ? ESTIMATE : source.ownCard ? SAME_CARD : OTHER_CARD[name]!);
  const phases: Array<[string, number]> = [
    ["cuda context", card.context_s],
    ["weights upload", weightBytes / (card.upload_GBps * 1e9)],
    ["graph capture", (card.graph_capture_s * numLayers) / card.model.num_layers],
    ["warm-up", card.warmup_s * (weightBytes / card.model.weight_bytes) * (card.hbm_TBps / HBM_TBPS[gpu])],
  ];
  return phases.map(([name, seconds]) => ({ name, seconds, kind, spread: spread(name) }));
}
