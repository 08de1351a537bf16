"""One optimizer step of decoupled PPO over microbatches (gradient accumulation).

Logprobs are computed only where they are needed: the decoder runs over the
padded batch, then the LM head is applied to the hidden states of target
positions alone, so a long prompt costs activations but no (T × vocab) logits.
The proximal policy is the current one before this update: with a single
minibatch its logprobs equal the current logprobs detached (no second forward);
with `proximal = "interpolate"` they are approximated from the behaviour
logprobs and token versions; with "behaviour" the behaviour policy is used.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import DynamicCache

from trainer.batch import PrefixGroup
from trainer.config import TrainerConfig
from trainer.head import head_logprobs
from trainer.losses import (
    loss_denominator,
    policy_loss,
    proximal_logprobs_interpolate,
    second_moment_keep,
    value_loss,
)
from trainer.memory import microbatch_budget
from trainer.policy import Reference

# A common start of the groups' prefixes at least this long runs once for the whole pass.
MIN_SHARED_PREFIX = 8


def shared_prefix_len(prefix: torch.Tensor, p_len: torch.Tensor) -> int:
    """Tokens every row of `prefix` (K, P), right-padded to lengths `p_len`, starts with, leaving
    each row at least its last token (whose hidden state predicts the first continuation token)."""
    limit = int(p_len.min()) - 1
    same = (prefix[:, :limit] == prefix[:1, :limit]).all(0)
    return int(same.long().cumprod(0).sum())


def _expanded(cache: DynamicCache, rows: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every layer's keys and values of a one-row cache as `rows` rows (views, no copy)."""
    return [(layer.keys.expand(rows, -1, -1, -1), layer.values.expand(rows, -1, -1, -1)) for layer in cache.layers]


def checkpointed(model: Any) -> bool:
    """Whether the next forward recomputes its layers in the backward (Hugging Face gradient
    checkpointing, on in training with gradients): its layers then drop any cache they are given."""
    return bool(getattr(model, "is_activation_checkpointing", False)) and model.training and torch.is_grad_enabled()


def _full_sequence_hidden(
    model: Any, prefix: torch.Tensor, p_len: torch.Tensor, cont: torch.Tensor, owner: torch.Tensor
) -> torch.Tensor:
    """(R, O, H): each continuation row run as one sequence, its group's prefix then the row, with no
    cache, so Hugging Face's checkpointed layers can replay it in the backward. Rows are right-padded
    (prefix padding moved past the row's end), which causal attention never sees: no mask needed.
    Each row pays for its prefix again; only one layer's activations are kept at a time."""
    device = cont.device
    r, o_max = cont.shape
    p_max = prefix.shape[1]
    rows_p = p_len[owner]  # (R,)
    ids = torch.zeros(r, p_max + o_max, dtype=torch.long, device=device)  # (R, L)
    ids[:, :p_max] = prefix[owner]  # its padding is overwritten by the row or lies past its end
    ids.scatter_(1, rows_p[:, None] + torch.arange(o_max, device=device)[None], cont)
    out = model.base_model(input_ids=ids, use_cache=False).last_hidden_state  # (R, L, H)
    at = (rows_p - 1)[:, None] + torch.arange(o_max, device=device)[None]  # position j predicts cont[:, j]
    return out.gather(1, at[..., None].expand(-1, -1, out.shape[-1]))


def _prefix_shared_hidden(
    model: Any, prefix: torch.Tensor, p_len: torch.Tensor, cont: torch.Tensor, owner: torch.Tensor
) -> torch.Tensor:
    """(R, O, H): the prefixes once each (their common start once for all) into a KV cache, then
    every continuation row on top of its group's keys and values."""
    device = cont.device
    k, p_max = prefix.shape
    o_max = cont.shape[1]
    ragged = bool((p_len < p_max).any())
    prefix_mask = torch.arange(p_max, device=device)[None] < p_len[:, None]  # (K, P)

    shared = shared_prefix_len(prefix, p_len) if k > 1 else 0
    if shared < MIN_SHARED_PREFIX:
        shared = 0
    # One embedding lookup for the three forwards: its backward builds one dense (V, H) gradient, not three.
    tail_ids = prefix[:, shared:]
    ids = torch.cat([prefix[0, :shared], tail_ids.flatten(), cont.flatten()])
    embeds = model.get_input_embeddings()(ids)
    shared_emb, tail_emb, cont_emb = embeds.split([shared, tail_ids.numel(), cont.numel()])
    cache = DynamicCache()
    if shared:  # the groups' common start (system prompt, tools, few-shot turns) runs once
        model.base_model(inputs_embeds=shared_emb[None], cache=cache, use_cache=True)
        cache = DynamicCache(ddp_cache_data=_expanded(cache, k))
    out = model.base_model(
        inputs_embeds=tail_emb.view(*tail_ids.shape, -1),
        attention_mask=prefix_mask.long() if ragged else None,
        cache=cache,
        use_cache=True,
    )
    head = out.last_hidden_state[torch.arange(k, device=device), p_len - 1 - shared]  # (K, H): predicts cont[:, 0]
    if k == 1:
        layers = _expanded(cache, cont.shape[0])
    else:
        layers = [(layer.keys[owner], layer.values[owner]) for layer in cache.layers]
    mask = None
    if ragged:
        mask = torch.cat([prefix_mask[owner], torch.ones(cont.shape, dtype=torch.bool, device=device)], dim=1).long()
    positions = p_len[owner][:, None] + torch.arange(o_max, device=device)[None]
    body = model.base_model(
        inputs_embeds=cont_emb.view(*cont.shape, -1),
        attention_mask=mask,
        position_ids=positions,
        cache=DynamicCache(ddp_cache_data=layers),
        use_cache=True,
    ).last_hidden_state  # (R, O, H)
    return torch.cat([head[owner][:, None], body[:, :-1]], dim=1)  # position j predicts cont[:, j]


def group_logprobs(
    model: Any, groups: list[PrefixGroup], device: torch.device, entropy: bool = False
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """log π(token) for every continuation position of each prefix group, (G, O) each, zero off the
    mask; with `entropy`, also the policy's entropy at those positions (same shapes), else [].

    The groups of one microbatch run as two batched forwards: their prefixes, right-padded to
    the longest, then all their continuations on top of the prefix KV (each continuation row
    gets its own group's keys and values, and an attention mask that hides the prefix padding).
    A prefix still runs once however many continuations share it, and the start all the prefixes
    have in common (a system prompt, tool schemas, few-shot turns; at least MIN_SHARED_PREFIX
    tokens) runs once, as a third forward before the prefixes' own tails; gradients from every
    continuation flow back into both. Batching the groups turns many small matmuls into a few
    larger ones, and the vocabulary-sized operations (the embedding lookup, the LM head over
    target positions, and the tied embedding's gradient) happen once per microbatch.

    Under gradient checkpointing (`checkpointed(model)`) the layers cannot take a cache, so each
    row runs instead as one full sequence, prefix included (`_full_sequence_hidden`).
    """
    hidden, cont, sel, temps = group_hidden(model, groups, device)
    return hidden_logprobs(model, hidden, cont, sel, temps, groups, entropy)


def hidden_logprobs(
    model: Any,
    hidden: torch.Tensor,  # (R, O, H) from `group_hidden`
    cont: torch.Tensor,  # (R, O)
    sel: torch.Tensor,  # (R, O) bool
    temps: torch.Tensor,  # (R,)
    groups: list[PrefixGroup],
    entropy: bool = False,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """`group_logprobs` from the hidden states of its groups: the LM head at the selected positions only."""
    inv_temp = (1.0 / temps)[:, None].expand_as(sel)[sel]  # (N,)
    lm_head = model.get_output_embeddings()
    logp, ent = head_logprobs(hidden[sel], lm_head.weight, lm_head.bias, cont[sel], inv_temp, entropy)
    per_token = [logp] if ent is None else [logp, ent]
    outs = [scatter_rows(sel, values, groups) for values in per_token]
    return outs[0], (outs[1] if entropy else [])


def scatter_rows(sel: torch.Tensor, values: torch.Tensor, groups: list[PrefixGroup]) -> list[torch.Tensor]:
    """Per-token `values` (N,) at the selected positions of `sel` (R, O) back to each group's (G, O), zero off it.
    Float32 whatever `values` came out in (a critic's head under bfloat16 autocast gives bfloat16)."""
    full = torch.zeros(sel.shape, dtype=torch.float32, device=sel.device).masked_scatter(sel, values.float())
    out, r = [], 0
    for g in groups:
        n, o = g.continuation.shape
        out.append(full[r : r + n, :o])
        r += n
    return out


def group_hidden(
    model: Any, groups: list[PrefixGroup], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The decoder's last hidden state (R, O, H) at each position that predicts a continuation token of
    the groups' R rows, with the rows' ids (R, O), loss mask (R, O) and temperatures (R,); see `group_logprobs`."""
    k = len(groups)
    p_len = torch.tensor([g.prefix.shape[0] for g in groups], device=device)
    rows = torch.tensor([g.continuation.shape[0] for g in groups], device=device)
    p_max = int(p_len.max())
    o_max = max(g.continuation.shape[1] for g in groups)
    pad = 0  # any id: padded positions are masked out of attention and of the loss
    prefix = torch.full((k, p_max), pad, dtype=torch.long)
    cont = torch.full((int(rows.sum()), o_max), pad, dtype=torch.long)
    sel = torch.zeros(cont.shape, dtype=torch.bool)
    temps = torch.ones(cont.shape[0])
    r = 0
    for i, g in enumerate(groups):
        n, o = g.continuation.shape
        prefix[i, : g.prefix.shape[0]] = g.prefix
        cont[r : r + n, :o] = g.continuation
        sel[r : r + n, :o] = g.loss_mask
        temps[r : r + n] = g.temperature
        r += n
    prefix, cont, sel, temps = prefix.to(device), cont.to(device), sel.to(device), temps.to(device)
    owner = torch.repeat_interleave(torch.arange(k, device=device), rows)  # (R,) group of each row
    if checkpointed(model):
        hidden = _full_sequence_hidden(model, prefix, p_len, cont, owner)
    else:
        hidden = _prefix_shared_hidden(model, prefix, p_len, cont, owner)
    return hidden, cont, sel, temps


def target_logprobs(model: Any, group: PrefixGroup, device: torch.device) -> torch.Tensor:
    """log π(token) for every continuation position of one prefix group; (G, O), zero off the mask."""
    return group_logprobs(model, [group], device)[0][0]


def padded_cost(groups: list[PrefixGroup]) -> int:
    """Tokens one `group_logprobs` pass over `groups` holds: every prefix padded to the longest,
    every continuation to the widest, and, when several groups share the pass, each continuation
    row's own copy of its prefix keys/values (counted as prefix tokens: an overestimate of their
    memory, which is a fraction of a token's activations)."""
    p = max(g.prefix.shape[0] for g in groups)
    o = max(g.continuation.shape[1] for g in groups)
    rows = sum(g.continuation.shape[0] for g in groups)
    return len(groups) * p + rows * o + (rows * p if len(groups) > 1 else 0)


def microbatches(
    groups: list[PrefixGroup],
    tokens_per_microbatch: int,
    fits: Callable[[list[PrefixGroup]], bool] | None = None,
) -> list[list[PrefixGroup]]:
    """Consecutive groups packed into passes of at most `tokens_per_microbatch` tokens of
    `padded_cost` each and, with `fits` (`trainer.memory.microbatch_budget`), whose estimated
    memory fits; a group over the budget on its own, which `pack` avoids, still gets a pass of
    its own."""
    out: list[list[PrefixGroup]] = []
    for group in groups:
        grown = [*out[-1], group] if out else []
        if out and padded_cost(grown) <= tokens_per_microbatch and (fits is None or fits(grown)):
            out[-1].append(group)
        else:
            out.append([group])
    return out


def recompute_proximal(
    model: Any,
    groups: list[PrefixGroup],
    device: torch.device,
    tokens_per_microbatch: int = 1 << 62,
    autocast_bf16: bool = False,
) -> None:
    """Store the current policy's logprobs on each group before several updates (under the same
    autocast as the training forward, so the ratio to them starts at 1 up to that precision)."""
    model.eval()
    with torch.no_grad(), autocast_for(device, autocast_bf16):
        for chunk in microbatches(groups, tokens_per_microbatch):
            for group, logp in zip(chunk, group_logprobs(model, chunk, device)[0]):
                group.prox_logprobs = logp.cpu()


def autocast_for(device: torch.device, bf16: bool) -> Any:
    """bfloat16 autocast on `device` with `bf16` (trainer.autocast_bf16), else nothing."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


@dataclass
class StepResult:
    loss: float
    grad_norm: float
    tokens: int
    stats: dict[str, float]


def _proximal(
    mb: PrefixGroup, logp: torch.Tensor, behav: torch.Tensor, proximal: str, device: torch.device, version: int
) -> torch.Tensor:
    """The proximal logprobs (G, O) a group is trained against: those stored on it, else by `proximal`."""
    if mb.prox_logprobs is not None:
        return mb.prox_logprobs.to(device)
    if proximal == "behaviour":
        return behav
    if proximal == "interpolate":
        return proximal_logprobs_interpolate(behav, logp.detach(), mb.versions.to(device), version + 1, version)
    return logp.detach()


def m2po_keeps(
    proxs: list[torch.Tensor], behavs: list[torch.Tensor], masks: list[torch.Tensor], tau: float
) -> list[torch.Tensor]:
    """M2PO's kept tokens (G, O) bool for each group of one pass, chosen over all the pass's trained
    tokens together (`second_moment_keep` on log π_prox/π_behav), as the loss of a microbatch."""
    log_w = torch.cat([(p.detach() - b.detach())[m.bool()] for p, b, m in zip(proxs, behavs, masks)])
    kept = second_moment_keep(log_w, tau).split([int(m.bool().sum()) for m in masks])
    return [torch.zeros_like(m, dtype=torch.bool).masked_scatter(m.bool(), k) for m, k in zip(masks, kept)]


def normaliser_for(batches: list[PrefixGroup], loss_agg: str) -> float:
    if loss_agg == "token_sum_norm":  # Dr. GRPO: a constant, num_sequences × longest reply
        longest = max(int(mb.loss_mask.sum(-1).max()) for mb in batches)
        return float(sum(mb.loss_mask.shape[0] for mb in batches) * longest)
    return sum(loss_denominator(mb.loss_mask, loss_agg) for mb in batches)


def _value_term(
    values: torch.Tensor, mb: PrefixGroup, clip: float, normaliser: float, device: torch.device, stats: dict
) -> torch.Tensor:
    """A group's clipped value loss (token mean over the step), its statistics added to `stats`."""
    if mb.old_values is None or mb.value_targets is None:
        raise ValueError("a step with a value head needs each group's old_values and value_targets (critic.prepare)")
    mask = mb.loss_mask.to(device)
    old, targets = mb.old_values.to(device), mb.value_targets.to(device)
    loss, value_stats = value_loss(values, old, targets, mask, value_clip=clip, normaliser=normaliser)
    stats.update(value_stats)
    return loss


def train_step(
    model: Any,
    optimizer: torch.optim.Optimizer,
    batches: list[PrefixGroup],
    cfg: TrainerConfig,
    device: torch.device,
    version: int,
    reference: Reference | None = None,
    keep_proximal: bool = False,
    value_head: torch.nn.Module | None = None,
    value_coef: float = 0.0,
    value_clip: float = 0.0,
) -> StepResult:
    """One optimizer step over `batches`. With `keep_proximal`, the proximal logprobs a group is
    first trained against (interpolated, or the behaviour's) are stored on it, so a later pass over
    the same group (another epoch) is measured against the same proximal policy, not the updated one.
    With `loss.m2po_tau`, M2PO's mask is chosen over each forward pass's trained tokens together (the
    proximal logprobs of a pass are known only after its forward; AReaL too masks per microbatch).
    With `value_head` (a critic's head on this model, `trainer/critic.py`), value_coef × the clipped value
    loss against each group's `old_values` and `value_targets` joins the loss: its gradient reaches the
    model's decoder and the head (whose own optimizer the caller steps)."""
    lcfg = cfg.loss
    model.train()
    optimizer.zero_grad(set_to_none=True)
    normaliser = normaliser_for(batches, lcfg.agg)
    value_normaliser = normaliser_for(batches, "token_mean")
    autocast = autocast_for(device, cfg.autocast_bf16)
    total_loss, tokens = 0.0, 0
    sums: dict[str, float] = {}
    for chunk in microbatches(batches, cfg.batch.tokens_per_microbatch, microbatch_budget(model, cfg)):
        values: list[torch.Tensor | None] = [None] * len(chunk)
        with autocast:
            if value_head is None:
                logps, entropies = group_logprobs(model, chunk, device, entropy=True)
            else:
                hidden, cont, sel, temps = group_hidden(model, chunk, device)
                logps, entropies = hidden_logprobs(model, hidden, cont, sel, temps, chunk, entropy=True)
                values = list(scatter_rows(sel, value_head(hidden[sel]), chunk))
        if not lcfg.entropy_coef:
            entropies = [e.detach() for e in entropies]  # logged only
        refs: list[torch.Tensor | None] = [None] * len(chunk)
        if reference is not None and lcfg.kl_coef > 0:
            with torch.no_grad(), autocast, reference.active() as ref_model:
                refs = list(group_logprobs(ref_model, chunk, device)[0])
        behavs = [mb.behav_logprobs.to(device) for mb in chunk]
        proxs = [_proximal(mb, lp, b, lcfg.proximal, device, version) for mb, lp, b in zip(chunk, logps, behavs)]
        if keep_proximal:
            for mb, prox in zip(chunk, proxs):
                if mb.prox_logprobs is None:
                    mb.prox_logprobs = prox.detach().cpu()
        keeps: list[torch.Tensor | None] = [None] * len(chunk)
        if lcfg.m2po_tau > 0:
            keeps = list(m2po_keeps(proxs, behavs, [mb.loss_mask.to(device) for mb in chunk], lcfg.m2po_tau))
        losses = []
        for mb, logp, ent, ref, behav, prox, keep, v in zip(
            chunk, logps, entropies, refs, behavs, proxs, keeps, values
        ):
            loss, stats = policy_loss(
                logp,
                prox,
                behav,
                mb.advantages.to(device),
                mb.loss_mask.to(device),
                eps_clip=lcfg.eps_clip,
                eps_clip_high=lcfg.eps_clip_high,
                behav_cap=lcfg.behav_cap,
                behav_cap_mode=lcfg.behav_cap_mode,
                ratio_level=lcfg.ratio_level,
                loss_agg=lcfg.agg,
                behav_floor=lcfg.behav_floor,
                keep=keep,
                ref_logp=ref,
                kl_coef=lcfg.kl_coef,
                normaliser=normaliser,
                entropy=ent,
                entropy_coef=lcfg.entropy_coef,
            )
            if v is not None:
                loss = loss + value_coef * _value_term(v, mb, value_clip, value_normaliser, device, stats)
            losses.append(loss)
            n = mb.num_tokens
            total_loss += float(loss.detach())
            tokens += n
            for key, value in stats.items():
                sums[key] = sums.get(key, 0.0) + float(value) * n
        torch.stack(losses).sum().backward()  # one backward per microbatch
    grad_norm = apply_gradients(model, optimizer, cfg.optim.grad_clip)
    return StepResult(
        loss=total_loss, grad_norm=grad_norm, tokens=tokens, stats={k: v / max(tokens, 1) for k, v in sums.items()}
    )


def apply_gradients(model: Any, optimizer: torch.optim.Optimizer, grad_clip: float) -> float:
    """The optimizer step on the accumulated gradients, clipped to `grad_clip` (0: unclipped) by their global
    norm, which is returned; the model is left in eval mode."""
    params = [p for p in model.parameters() if p.grad is not None]
    clip = grad_clip if grad_clip > 0 else float("inf")
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
    optimizer.step()
    model.eval()
    return grad_norm
