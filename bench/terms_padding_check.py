"""The compiled loss chunks (objective.compile_terms) on a vocabulary of odd size, as a2d's mask token makes it
(49,152 + 1): forward and backward through chunked_terms on the GPU, for the compiler's default options and with
its stride padding off. Prints one line per case."""
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, "convert")
from a2d_convert.objective import _chunk_terms, chunked_terms  # noqa: E402

d = 576
for vocab, options in [(49152, None), (49153, None), (49153, {"comprehensive_padding": False})]:
    torch._dynamo.reset()
    weight = (torch.randn(vocab, d, device="cuda") * 0.02).to(torch.bfloat16)

    def head(x):
        return F.linear(x, weight)

    terms = torch.compile(_chunk_terms, options=options) if options else torch.compile(_chunk_terms)
    started = time.time()
    try:
        for rows in (9000, 9000, 7000):
            hidden = torch.randn(rows, d, device="cuda", requires_grad=True)
            index = torch.arange(rows, device="cuda")
            targets = torch.randint(0, vocab, (rows,), device="cuda")
            weights = torch.ones(rows, device="cuda")
            with torch.autocast("cuda", torch.bfloat16):
                out = chunked_terms(head, hidden, index, targets, weights, hidden.detach(), index, head, 4096, True, 0.5, terms)
                loss = out[0] + out[2] + 2 * out[3]
            loss.backward()
        torch.cuda.synchronize()
        print(f"vocab {vocab} options {options}: ok, {time.time() - started:.1f} s", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"vocab {vocab} options {options}: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
