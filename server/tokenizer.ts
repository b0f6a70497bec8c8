// The model's tokenizer, read from its folder exactly as docs/model-format.md ("Tokenizer and prompts")
// says: plain prompts get the tokenizer's special tokens, rendered chats do not, output skips specials.
import { readFile } from "node:fs/promises";
import { join } from "node:path";

import { Tokenizer } from "@huggingface/tokenizers";

import { ChatTemplate } from "./chat-template.js";

/** Named special tokens a chat template may refer to, as transformers passes them (`bos_token`, ...). */
const NAMED_SPECIAL_TOKENS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"];

/** What a ModelTokenizer is built from, as read from the model folder: plain data, so a worker thread can take a copy. */
export interface TokenizerFiles {
  modelDir: string;
  tokenizerJson: Record<string, unknown>;
  config: Record<string, unknown>;
  chatTemplate: string | null;
}

export class ModelTokenizer {
  private constructor(
    private readonly tokenizer: Tokenizer,
    private readonly specialIds: ReadonlySet<number>,
    private readonly cleanUpSpaces: boolean,
    /** The chat template, or null when the model folder has none (chat requests are then refused). */
    readonly chatTemplate: ChatTemplate | null,
  ) {}

  static async load(modelDir: string): Promise<ModelTokenizer> {
    return ModelTokenizer.fromFiles(await ModelTokenizer.readFiles(modelDir));
  }

  static async readFiles(modelDir: string): Promise<TokenizerFiles> {
    const tokenizerJson = await readJson(join(modelDir, "tokenizer.json"));
    const config = await readJson(join(modelDir, "tokenizer_config.json"));
    return { modelDir, tokenizerJson, config, chatTemplate: await readChatTemplate(modelDir, config) };
  }

  static fromFiles({ modelDir, tokenizerJson, config, chatTemplate: templateSource }: TokenizerFiles): ModelTokenizer {
    let tokenizer: Tokenizer;
    try {
      tokenizer = new Tokenizer(tokenizerJson, config);
    } catch (error) {
      throw new Error(
        `${join(modelDir, "tokenizer.json")}: cannot build the tokenizer (${messageOf(error)}); ` +
          "re-save it with a current `tokenizers`/transformers.",
      );
    }
    if (tokenizer.decoder !== null) matchRustByteFallback(tokenizer.decoder as unknown as DecoderNode);
    const specialIds = new Set<number>();
    for (const [id, token] of tokenizer.get_added_tokens_decoder()) if (token.special) specialIds.add(id);

    const specialTokens: Record<string, string> = {};
    for (const name of NAMED_SPECIAL_TOKENS) {
      const text = tokenText(config[name]);
      if (text !== undefined) specialTokens[name] = text;
    }
    const template = templateSource === null ? null : new ChatTemplate(templateSource, specialTokens, modelDir);
    // transformers 5 defaults this to false; tokenizers.js would default it to true.
    const cleanUpSpaces = config.clean_up_tokenization_spaces === true;
    return new ModelTokenizer(tokenizer, specialIds, cleanUpSpaces, template);
  }

  /** A plain prompt: the post-processor adds what the tokenizer adds (a BOS, say). */
  encodePrompt(text: string): number[] {
    return this.tokenizer.encode(text, { add_special_tokens: true }).ids;
  }

  /** A rendered chat: the template already wrote every special token. */
  encodeRendered(text: string): number[] {
    return this.tokenizer.encode(text, { add_special_tokens: false }).ids;
  }

  /** Output text: special tokens skipped. */
  decode(ids: readonly number[]): string {
    if (ids.length === 0) return "";
    return this.tokenizer.decode(ids as number[], {
      skip_special_tokens: true,
      clean_up_tokenization_spaces: this.cleanUpSpaces,
    });
  }

  /**
   * Output text with special tokens skipped except `keep`: reasoning tags must survive decoding even in
   * tokenizers that mark them special, or the reasoning could not be told from the answer.
   */
  decodeKeeping(ids: readonly number[], keep: ReadonlySet<number>): string {
    const kept = ids.filter((id) => !this.specialIds.has(id) || keep.has(id));
    if (kept.length === 0) return "";
    return this.tokenizer.decode(kept, { skip_special_tokens: false, clean_up_tokenization_spaces: this.cleanUpSpaces });
  }

  /** The id of a token given by its text, when the vocabulary holds it as one token. */
  tokenId(text: string): number | undefined {
    return this.tokenizer.token_to_id(text);
  }
}

async function readJson(path: string): Promise<Record<string, unknown>> {
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch (error) {
    throw new Error(`${path}: cannot read it (${messageOf(error)}); the model folder must hold the tokenizer files (docs/model-format.md).`);
  }
  try {
    const value: unknown = JSON.parse(text);
    if (typeof value !== "object" || value === null || Array.isArray(value)) throw new Error("not a JSON object");
    return value as Record<string, unknown>;
  } catch (error) {
    throw new Error(`${path}: not valid JSON (${messageOf(error)}); re-save the tokenizer files.`);
  }
}

/** chat_template.jinja beside the config wins, as in transformers 5; else tokenizer_config's "chat_template". */
async function readChatTemplate(modelDir: string, config: Record<string, unknown>): Promise<string | null> {
  try {
    return await readFile(join(modelDir, "chat_template.jinja"), "utf8");
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
  }
  const template = config.chat_template;
  if (typeof template === "string") return template;
  if (Array.isArray(template)) {
    // Named templates: [{name, template}]; the one named "default" is what apply_chat_template uses.
    const named = template.find((entry) => (entry as { name?: unknown })?.name === "default") as { template?: unknown } | undefined;
    if (typeof named?.template === "string") return named.template;
  }
  return null;
}

/**
 * The Rust tokenizer turns a run of byte tokens that is not valid UTF-8 into one U+FFFD per byte;
 * tokenizers.js decodes it leniently (one U+FFFD per bad subsequence). Outputs must match the Python side
 * character for character, so the byte-fallback steps get a decoder with the Rust rule.
 */
function matchRustByteFallback(node: DecoderNode): void {
  node.decoders?.forEach(matchRustByteFallback);
  if (node.config?.type !== "ByteFallback") return;
  const strict = new TextDecoder("utf-8", { fatal: true });
  node.text_decoder = {
    decode(bytes: Uint8Array): string {
      try {
        return strict.decode(bytes);
      } catch {
        return "\uFFFD".repeat(bytes.length);
      }
    },
  };
}

/** The parts of a tokenizers.js decoder used above (the package's type exports do not resolve under NodeNext). */
interface DecoderNode {
  config?: { type?: string };
  decoders?: DecoderNode[];
  text_decoder?: { decode(bytes: Uint8Array): string };
}

/** A special token in tokenizer_config.json is a string or an AddedToken object with `content`. */
function tokenText(value: unknown): string | undefined {
  if (typeof value === "string") return value;
  if (typeof value === "object" && value !== null && typeof (value as { content?: unknown }).content === "string") {
    return (value as { content: string }).content;
  }
  return undefined;
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
