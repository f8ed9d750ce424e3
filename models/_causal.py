"""The graph functions every model exports, from its `forward(input_ids, cache, last_only)`."""
from __future__ import annotations

from deploycc import nn


class CausalLM(nn.Module):
    def prefill(self, input_ids: nn.Tensor, cache: nn.Cache) -> nn.Tensor:
        """The last position's logits: what generation needs (the head runs on one row)."""
        return self.forward(input_ids, cache, last_only=True)

    def prefill_all(self, input_ids: nn.Tensor, cache: nn.Cache) -> nn.Tensor:
        return self.forward(input_ids, cache)

    def decode(self, input_ids: nn.Tensor, cache: nn.Cache) -> nn.Tensor:
        return self.forward(input_ids, cache)

    def step(self, input_ids: nn.Tensor, cache: nn.Cache) -> nn.Tensor:
        """A batched step over a page pool (cache: kv_cache_spec with a page_size): the tokens of several
        sequences, each sequence's last token's logits [1, batch, vocab]."""
        return self.forward(input_ids, cache, last_only=True)

    def step_one(self, input_ids: nn.Tensor, cache: nn.Cache) -> nn.Tensor:
        """A batched step of one token [1, 1], so of one sequence (its logits [1, 1, vocab]), traced apart so that its
        shapes are constants (deploycc/export.py: one_token_step)."""
        return self.forward(input_ids, cache, last_only=True)

    def step_all(self, input_ids: nn.Tensor, cache: nn.Cache) -> nn.Tensor:
        """A batched step with every token's logits [1, seq_len, vocab] (a prompt's log probabilities: the
        server's echo)."""
        return self.forward(input_ids, cache)
