"""The demo's model and its GRPO step: imported by each demo rank only, since it imports torch
at the top (``python -m mstx_marks demo`` runs it; :mod:`.demo` holds the driver)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from mstx_marks.base import phases
from mstx_marks.core.sampling import window

__all__ = ["Job", "TinyLM"]

VOCAB, DIM, PROMPT, GROUP, PROMPTS = 32, 32, 4, 4, 2

#: What marks a phase: ``Mark`` for the recorded steps, a null context for the warm-up.
Span = Callable[..., AbstractContextManager[Any]]


class TinyLM(nn.Module):
    """A one-layer causal transformer over a 32-token vocabulary."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        layer = nn.TransformerEncoderLayer(DIM, 2, 2 * DIM, dropout=0.0, batch_first=True)
        self.body = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        causal = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        out: torch.Tensor = self.head(self.body(self.embed(ids), mask=causal, is_causal=True))
        return out


def token_logprobs(model: nn.Module, seqs: torch.Tensor) -> torch.Tensor:
    logits = model(seqs[:, :-1])[:, PROMPT - 1 :]
    return torch.log_softmax(logits, -1).gather(-1, seqs[:, PROMPT:, None]).squeeze(-1)


class Job:
    """One rank's actor and reference model, and the GRPO step that trains the actor."""

    def __init__(self, world: int, tokens: int) -> None:
        self.world, self.tokens = world, tokens
        self.actor, self.ref = TinyLM(), TinyLM()
        self.ref.load_state_dict(self.actor.state_dict())
        self.ref.requires_grad_(False)

    def warm_up(self, seed: int, span: Span) -> None:
        """One unrecorded step on a throwaway copy of the actor (its own optimizer, its own random
        numbers): every lazy import and first-call set-up, the first collectives included, runs
        before the barrier, so that step 1 costs what the others cost. The real actor, optimizer
        and sampler are untouched."""
        scratch = TinyLM()
        scratch.load_state_dict(self.actor.state_dict())
        opt = torch.optim.Adam(scratch.parameters(), lr=3e-3)
        self.grpo_step(scratch, opt, torch.Generator().manual_seed(seed), span)

    def rollout(self, actor: nn.Module, gen: torch.Generator, span: Span) -> torch.Tensor:
        prompts = torch.randint(0, VOCAB, (PROMPTS, PROMPT), generator=gen)
        seqs = prompts.repeat_interleave(GROUP, 0)
        # One range object per rollout, so the window counts this rollout's tokens.
        one_step = span(phases.VLLM_ONE_STEP, sample=window(1, max(2, self.tokens - 1)))
        for _ in range(self.tokens):
            with one_step:
                probs = torch.softmax(actor(seqs)[:, -1], -1)
                nxt = torch.multinomial(probs, 1, generator=gen)
                seqs = torch.cat([seqs, nxt], 1)
        return seqs

    def grpo_step(
        self, actor: nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator, span: Span
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One GRPO step (rollout, reward, log-probs, advantages, update); (reward, loss)."""
        with span(phases.STEP):
            with span(phases.GENERATE_SEQUENCES), torch.no_grad():
                seqs = self.rollout(actor, gen, span)
            with span(phases.REWARD):
                # Reward: how many generated tokens are even, a goal the actor can learn.
                reward = (seqs[:, PROMPT:] % 2 == 0).float().mean(1)
            with span(phases.COMPUTE_REF_LOG_PROB), torch.no_grad():
                ref_lp = token_logprobs(self.ref, seqs)
            with span(phases.COMPUTE_LOG_PROB), torch.no_grad():
                old_lp = token_logprobs(actor, seqs)
            with span(phases.ADV):
                grouped = reward.view(PROMPTS, GROUP)
                std = grouped.std(1, keepdim=True) + 1e-6
                adv = ((grouped - grouped.mean(1, keepdim=True)) / std).view(-1, 1)
            with span(phases.UPDATE_ACTOR):
                loss = self.update(actor, opt, seqs, old_lp, ref_lp, adv)
        return reward, loss

    def update(
        self,
        actor: nn.Module,
        opt: torch.optim.Optimizer,
        seqs: torch.Tensor,
        old_lp: torch.Tensor,
        ref_lp: torch.Tensor,
        adv: torch.Tensor,
    ) -> torch.Tensor:
        lp = token_logprobs(actor, seqs)
        ratio = torch.exp(lp - old_lp)
        pg = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
        loss = pg + 0.05 * (lp - ref_lp).pow(2).mean()
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it untyped
        for p in actor.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= self.world
        opt.step()
        return loss
