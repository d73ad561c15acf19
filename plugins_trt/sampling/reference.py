"""Next-token selection: greedy, or temperature / top-k / top-p sampling (reference)."""

import torch


def sampling_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The distribution `sample` draws from: fp32 probabilities [V] for logits [V].

    temperature 0 is greedy: all mass on argmax (lowest index among ties). Otherwise logits / temperature, keep
    the top_k largest (0 = all; ties with the k-th value are kept), keep the smallest set whose probability reaches
    top_p (1 = all; top_p must be > 0), renormalise what is left.
    """
    if temperature == 0:
        return torch.nn.functional.one_hot(torch.argmax(logits), logits.shape[-1]).float()
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
    return logits.softmax(-1)


def sample(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
           generator: torch.Generator | None = None) -> int:
    """Pick one token from logits [V].

    temperature 0 is greedy (argmax). Otherwise logits / temperature, keep the top_k largest (0 = all),
    keep the smallest set whose probability reaches top_p (1 = all), and draw from what is left
    (`sampling_probs`).
    """
    if temperature == 0:
        return int(torch.argmax(logits))
    return int(torch.multinomial(sampling_probs(logits, temperature, top_k, top_p), 1, generator=generator))
