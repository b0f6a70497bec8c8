"""Reference side of the tokenizer tests: builds small tokenizer folders and answers with what the Python
`tokenizers` / transformers stack computes for them, so the TS tokenizer can be compared id for id.

    tokenizer-reference.py make --flavour byte-level|metaspace --out DIR
    tokenizer-reference.py answer --jobs JOBS.json     ([{model, cases}] in; one answer per job, as JSON, out)

Two flavours cover the two families of fast tokenizers in use: byte-level BPE (GPT-2, Qwen, Llama 3) and
sentencepiece-style BPE with a metaspace normaliser and byte fallback (Llama 2, MiniCPM).
"""

import argparse
import json
import pathlib

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SPECIAL = ["<|im_start|>", "<|im_end|>", "<|mask|>"]
# Think tags are added tokens but not special ones, as in current reasoning models: decode keeps them.
THINK = [AddedToken(tag, normalized=False, special=False) for tag in ("<think>", "</think>")]

# A ChatML template with an optional thinking switch; written for these tests, exercising the Jinja
# features real templates use (loops, namespaces, string tests, slicing, filters, bos_token).
CHAT_TEMPLATE = """{{- bos_token -}}
{%- if tools is not none or documents is not none -%}tools: {{ tools | tojson }}{%- endif -%}
{%- set ns = namespace(system='') -%}
{%- if messages[0]['role'] == 'system' -%}
{%- set ns.system = messages[0]['content'] -%}
{%- set rest = messages[1:] -%}
{%- else -%}
{%- set rest = messages -%}
{%- endif -%}
{%- if ns.system -%}
<|im_start|>system
{{ ns.system | trim }}<|im_end|>
{% endif -%}
{%- for message in rest -%}
{%- if message.content is string -%}
{%- set text = message.content -%}
{%- else -%}
{%- set text = message.content | map(attribute='text') | join('') -%}
{%- endif -%}
{%- if message.role == 'assistant' -%}
{%- if '</think>' in text -%}
{%- set text = text.split('</think>')[-1].lstrip('\\n') -%}
{%- endif -%}
<|im_start|>assistant
{% if loop.last and message.reasoning_content %}<think>
{{ message.reasoning_content.strip('\\n') }}
</think>

{% endif %}{{ text }}<|im_end|>
{% else -%}
<|im_start|>{{ message.role }}
{{ text }}<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% endif -%}
{%- endif -%}
"""


def corpus() -> list[str]:
    words = (
        "the model reads a block of masked tokens and reveals the most confident ones first while the "
        "server streams each committed block to the client who asked a question about prime numbers "
        "gradients kernels attention caches and the quick brown fox jumps over the lazy dog 0123456789 "
        "Hello World café naïve déjà vu 你好世界 こんにちは 🙂 <think> reasoning </think> answer"
    ).split()
    lines = []
    for i in range(400):
        lines.append(" ".join(words[(i * 7 + k * 3) % len(words)] for k in range(12)))
    return lines


def make_byte_level(out: pathlib.Path) -> None:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus(), trainer)
    tok.add_special_tokens(SPECIAL)
    tok.add_tokens(THINK)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    # A template in its own file, as transformers 5 saves it.
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE.replace("{{- bos_token -}}\n", ""))


def make_metaspace(out: pathlib.Path) -> None:
    # Train on metaspace-split text, then rebuild the model with <unk>/<s>/</s> and the 256 byte tokens in
    # front: the layout transformers gives sentencepiece-converted tokenizers (legacy=False).
    trainer_tok = Tokenizer(models.BPE())
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    trainer_tok.train_from_iterator(corpus(), trainers.BpeTrainer(vocab_size=500))
    trained = json.loads(trainer_tok.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece in sorted(trained["vocab"], key=trained["vocab"].get):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.add_special_tokens(["<unk>", "<s>", "</s>"] + SPECIAL)
    tok.add_tokens(THINK)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": {"__type": "AddedToken", "content": "<s>", "special": True, "lstrip": False, "rstrip": False, "normalized": False},
        "eos_token": "<|im_end|>",
        "unk_token": "<unk>",
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def answer(model: pathlib.Path, cases: dict) -> dict:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    encoded = [tok.encode(text) for text in cases["texts"]]
    chats = []
    for chat in cases["chats"]:
        kwargs = {} if chat.get("enable_thinking") is None else {"enable_thinking": chat["enable_thinking"]}
        rendered = tok.apply_chat_template(chat["messages"], add_generation_prompt=True, tokenize=False, **kwargs)
        ids = tok.encode(rendered, add_special_tokens=False)
        chats.append({"text": rendered, "ids": ids})
    decoded = [tok.decode(ids, skip_special_tokens=True) for ids in cases["decode"]]
    return {"encoded": encoded, "chats": chats, "decoded": decoded}


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("make")
    make.add_argument("--flavour", choices=["byte-level", "metaspace"], required=True)
    make.add_argument("--out", type=pathlib.Path, required=True)
    ans = sub.add_parser("answer")
    # Several folders per call: importing transformers costs seconds, once is enough.
    ans.add_argument("--jobs", type=pathlib.Path, required=True)
    args = parser.parse_args()
    if args.command == "make":
        args.out.mkdir(parents=True, exist_ok=True)
        (make_byte_level if args.flavour == "byte-level" else make_metaspace)(args.out)
    else:
        jobs = json.loads(args.jobs.read_text())
        print(json.dumps([answer(pathlib.Path(job["model"]), job["cases"]) for job in jobs]))


if __name__ == "__main__":
    main()
