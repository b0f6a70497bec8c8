"""A small OpenAI-compatible chat server over Hugging Face transformers' autoregressive `generate`, to
calibrate `a2d eval` on an AR model (the base a2d converts from) with the same client, prompts and
graders. A measuring tool, not part of the served product.

  .venv/bin/python -m a2d_convert import --source .cache/demo/base.gguf --out .cache/demo/base-hf
  .venv/bin/python bench/ar_server.py --model .cache/demo/base-hf --port 18501

- GET /v1/models, GET /health ({"status": "ok", "model", "queue": {"running", "waiting", "max_running": 1}});
- POST /v1/chat/completions, streamed (SSE, usage in the last chunk) or not; max_tokens, temperature
  (0 or absent: greedy), top_p, seed; the tokenizer's chat template; stops at its eos token.
- One generation at a time, like a2d's engine: later requests wait their turn and receive an SSE
  comment (`: waiting`) every few seconds while they do, so clients see the stream is alive.
The model is an HF folder (weights, tokenizer, chat template); `a2d_convert import` makes one from the
GGUF the demo model was converted from, the same bf16 weights, run here in float32.
"""

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TextIteratorStreamer

HEARTBEAT_S = 5.0


class Generator:
    def __init__(self, model_dir, threads):
        torch.set_num_threads(threads)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model.eval()
        self.turn = threading.Lock()
        self.waiting = 0
        self.running = 0

    def stream(self, messages, max_tokens, temperature, top_p, seed):
        """Yields text pieces, then (prompt_tokens, completion_tokens, finish_reason)."""
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        sampling = {"do_sample": False} if not temperature else {"do_sample": True, "temperature": temperature, "top_p": top_p or 1.0}
        if seed is not None:
            torch.manual_seed(seed)
        result = {}

        def run():
            with torch.inference_mode():
                result["output"] = self.model.generate(**ids, max_new_tokens=max_tokens, streamer=streamer,
                                                       eos_token_id=self.tokenizer.eos_token_id,
                                                       pad_token_id=self.tokenizer.eos_token_id, **sampling)

        worker = threading.Thread(target=run)
        worker.start()
        for piece in streamer:
            if piece:
                yield piece
        worker.join()
        prompt_tokens = ids["input_ids"].shape[1]
        generated = result["output"][0, prompt_tokens:].tolist()
        finished = bool(generated) and generated[-1] == self.tokenizer.eos_token_id
        completion_tokens = len(generated)
        yield (prompt_tokens, completion_tokens, "stop" if finished or completion_tokens < max_tokens else "length")


def make_handler(generator, model_id):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def send_json(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/v1/models":
                self.send_json(200, {"object": "list", "data": [{"id": model_id, "object": "model", "owned_by": "transformers"}]})
            elif self.path == "/health":
                queue = {"running": generator.running, "waiting": generator.waiting, "max_running": 1}
                self.send_json(200, {"status": "ok", "model": model_id, "decoding": {"method": "autoregressive"}, "queue": queue})
            else:
                self.send_json(404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error"}})

        def do_POST(self):
            if self.path != "/v1/chat/completions":
                self.send_json(404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error"}})
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
                messages = body["messages"]
                max_tokens = int(body.get("max_tokens") or 512)
            except (ValueError, KeyError, TypeError) as error:
                self.send_json(400, {"error": {"message": f"bad request: {error}", "type": "invalid_request_error"}})
                return
            stream = bool(body.get("stream"))
            if stream:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.send_header("connection", "close")  # the body ends when the connection does
                self.end_headers()
            generator.waiting += 1
            while not generator.turn.acquire(timeout=HEARTBEAT_S):
                if stream:
                    self.wfile.write(b": waiting\n\n")
                    self.wfile.flush()
            generator.waiting -= 1
            generator.running = 1
            try:
                self.generate(body, messages, max_tokens, stream)
            except (BrokenPipeError, ConnectionResetError):
                pass
            finally:
                generator.running = 0
                generator.turn.release()

        def generate(self, body, messages, max_tokens, stream):
            created = int(time.time())
            chunk = lambda delta, finish=None: {"id": "ar", "object": "chat.completion.chunk", "created": created, "model": model_id,
                                                 "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            send = lambda value: (self.wfile.write(f"data: {json.dumps(value)}\n\n".encode()), self.wfile.flush())
            text = []
            if stream:
                send(chunk({"role": "assistant"}))
            for piece in generator.stream(messages, max_tokens, body.get("temperature"), body.get("top_p"), body.get("seed")):
                if isinstance(piece, tuple):
                    prompt_tokens, completion_tokens, finish = piece
                    break
                text.append(piece)
                if stream:
                    send(chunk({"content": piece}))
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}
            if stream:
                send(chunk({}, finish))
                send({"id": "ar", "object": "chat.completion.chunk", "created": created, "model": model_id, "choices": [], "usage": usage})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True
            else:
                self.send_json(200, {"id": "ar", "object": "chat.completion", "created": created, "model": model_id,
                                     "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(text)}, "finish_reason": finish}],
                                     "usage": usage})

    return Handler


def main():
    from pathlib import Path

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="HF model folder (config, safetensors, tokenizer)")
    parser.add_argument("--model-name", default="ar-base")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18501)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (on a shared CPU more than one can be far slower)")
    args = parser.parse_args()
    generator = Generator(args.model, args.threads)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(generator, args.model_name))
    print(f"ar_server: {args.model_name} ready at http://{args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
