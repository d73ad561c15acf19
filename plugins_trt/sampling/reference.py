"""Next-token selection: greedy, or temperature / top-k / top-p sampling (reference)."""

import torch


def sample(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
           generator: torch.Generator | None = None) -> int:
    """Pick one token from logits [V].

    temperature 0 is greedy (argmax). Otherwise logits / temperature, keep the top_k largest (0 = all),
    keep the smallest set whose probability reaches top_p (1 = all), and draw from what is left.
    """
    if temperature == 0:
        return int(torch.argmax(logits))
    logits = logits.float() / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # drop a token when the mass before it already reaches top_p (the top token always stays)
        drop = (cum - sorted_logits.softmax(-1)) >= top_p
        logits = logits.scatter(0, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = logits.softmax(-1)
    return int(torch.multinomial(probs, 1, generator=generator))
