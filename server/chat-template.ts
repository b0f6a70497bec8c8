// The model's chat template rendered with @huggingface/jinja, with the variables transformers'
// apply_chat_template gives it: messages, add_generation_prompt, the named special tokens and extra kwargs.
import { Template } from "@huggingface/jinja";

export interface TemplateMessage {
  role: string;
  content: string | Array<{ type: string; text?: string }>;
  reasoning_content?: string;
}

export interface RenderOptions {
  /** Left undefined, the template sees `enable_thinking` as undefined and picks its own default. */
  enableThinking?: boolean;
}

/** The template itself refused the conversation (its raise_exception, or a type error inside it). */
export class ChatTemplateError extends Error {}

export class ChatTemplate {
  private readonly template: Template;

  constructor(
    readonly source: string,
    private readonly specialTokens: Readonly<Record<string, string>>,
    modelDir: string,
  ) {
    try {
      this.template = new Template(source);
    } catch (error) {
      throw new Error(
        `${modelDir}: the chat template does not parse (${error instanceof Error ? error.message : String(error)}); ` +
          "fix chat_template in tokenizer_config.json or chat_template.jinja.",
      );
    }
  }

  /** The prompt for the assistant's next turn. */
  render(messages: readonly TemplateMessage[], options: RenderOptions = {}): string {
    const variables: Record<string, unknown> = {
      ...this.specialTokens,
      messages,
      // transformers passes these as None: "tools is not none" must be false, not true as for undefined.
      tools: null,
      documents: null,
      add_generation_prompt: true,
    };
    if (options.enableThinking !== undefined) variables.enable_thinking = options.enableThinking;
    try {
      return this.template.render(variables);
    } catch (error) {
      throw new ChatTemplateError(error instanceof Error ? error.message : String(error));
    }
  }
}
