"""The decoding sequences' one-token steps, batched in mlx-lm's batch caches.

mlx-lm's ``BatchGenerator`` normalises every sequence's logits over the whole vocabulary on
every step (a log-sum-exp: 13 of the 108 ms a 16-sequence step takes here, since MLX's CPU
``exp`` is slow), runs a separate forward pass for each newcomer's first input token, and
keeps its next step in flight, so a finished sequence's cache holds one position more than
its tokens. This batch keeps mlx-lm's caches (``BatchKVCache`` and its kin: left-padded
merge, extend, extract, filter) and its model, but samples from raw logits, normalises only
the rows that need it (nucleus sampling, a top-token probability), and lets a newcomer's
first token ride the next shared step. ADR 0011 has the measurements.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from semantic.adapters.mlx.accelerator import Group, Passes, PendingStep
from semantic.adapters.mlx.kv.batch_caches import (
    adopted,
    extracted_rows,
    handed_back,
    merged_layer,
)
from semantic.adapters.mlx.lm import BatchKVCache, KVCache
from semantic.adapters.mlx.models.model_parts import BodyAndHead
from semantic.adapters.mlx.sampling import Sampler, top_prob
from semantic.adapters.mlx.token_mask import masked
from semantic.ports.grammar import GrammarMatcher
from semantic.ports.model_backend import DecodedToken

Caches = list[Any] | Callable[[], list[Any]]
"""A sequence's per-layer caches (mlx-lm leaves them untyped), or what builds them."""


@dataclass(slots=True)
class _Row:
    seq_id: str
    sampler: Sampler
    track_top_prob: bool
    remaining: int
    has_output: bool = False
    """False until the row's first pass: its first input was already reported by prefill."""
    matcher: GrammarMatcher | None = None
    """A constrained row's grammar, told every token the row reports."""
    told: bool = False
    """Its matcher was told this step's input before the pass (to find ``run``)."""
    run: tuple[int, ...] = ()
    """Tokens its grammar forces after this step's input, fed in the same pass."""


class DecodeBatch:
    """Each ``step`` runs one pass that feeds every row its newest token and samples the
    next, and reports the tokens the previous pass sampled. So a row's cache always holds
    every token it has reported (a finished sequence keeps its final token's KV, and a
    client sending the reply back hits all of it), at no extra pass."""

    def __init__(
        self,
        model: Any,
        stop_tokens: Iterable[int],
        passes: Passes | None = None,
        *,
        forced_runs: bool = True,
    ) -> None:
        """``passes``: an accelerator's (``accelerator.py``), which may take a pass off
        MLX or carry a prompt chunk along; without it, every pass is mlx-lm's own.
        ``forced_runs``: a lone constrained row's forced tokens ride its step (False:
        tests compare)."""
        self._model = model
        self._forced_runs = forced_runs
        self._passes = passes
        self._parts = BodyAndHead.of(model)
        self._stop = frozenset(stop_tokens)
        self._rows: list[_Row] = []
        self._caches: list[Any] = []  # one batch cache per layer; mlx-lm leaves them untyped
        self._inputs: mx.array | None = None  # (rows,): each row's next input token
        self._tops: mx.array | None = None  # (rows,): its probability, for tracked rows
        self._finished: dict[str, list[Any]] = {}
        self._joining: list[tuple[_Row, Caches, int]] = []
        self._failed: dict[str, Exception] = {}

    def __len__(self) -> int:
        return len(self._rows) + len(self._joining)

    def __contains__(self, seq_id: object) -> bool:
        rows = [*self._rows, *(row for row, _, _ in self._joining)]
        return any(row.seq_id == seq_id for row in rows)

    def add(
        self,
        seq_id: str,
        caches: Caches,
        first_token: int,
        max_new_tokens: int,
        sampler: Sampler,
        *,
        track_top_prob: bool = False,
        matcher: GrammarMatcher | None = None,
    ) -> None:
        """Join with a prefilled cache; ``first_token`` is fed at the next pass, which makes
        the first of at most ``max_new_tokens`` new tokens. Newcomers are merged into the
        batch together at the next step: one copy of the batch's caches, not one each.
        ``caches`` may be a function that builds them, called at that step. ``matcher``:
        the row's grammar, which has already accepted ``first_token``."""
        row = _Row(seq_id, sampler, track_top_prob, max_new_tokens, matcher=matcher)
        self._joining.append((row, caches, first_token))

    def _admit_joining(self) -> None:
        if not self._joining:
            return
        joining, built = self._build_joining()
        if not joining:
            return
        lone = adopted(built[0]) if not self._caches and len(built) == 1 else None
        merged = lone or [merged_layer(layers) for layers in zip(*built, strict=True)]
        if self._caches:
            for mine, theirs in zip(self._caches, merged, strict=True):
                mine.extend(theirs)
        else:
            self._caches = merged
        firsts = mx.array([first for _, _, first in joining])
        unknown = mx.zeros((len(joining),))
        self._inputs = firsts if self._inputs is None else mx.concatenate([self._inputs, firsts])
        self._tops = unknown if self._tops is None else mx.concatenate([self._tops, unknown])
        self._rows += [row for row, _, _ in joining]

    def _build_joining(self) -> tuple[list[tuple[_Row, Caches, int]], list[list[Any]]]:
        """The newcomers whose caches could be built, and those caches. One that fails (no
        memory to gather a restored prefix, say) is left out and noted for
        ``take_failed``, so it fails alone instead of failing the whole step."""
        joining, self._joining = self._joining, []
        admitted: list[tuple[_Row, Caches, int]] = []
        built: list[list[Any]] = []
        for entry in joining:
            try:
                built.append(_built(entry[1]))
            except Exception as error:  # noqa: BLE001 - reported per sequence by take_failed
                self._failed[entry[0].seq_id] = error
                continue
            admitted.append(entry)
        return admitted, built

    def take_failed(self) -> dict[str, Exception]:
        """The sequences left out of the batch since the last call, with their errors."""
        failed, self._failed = self._failed, {}
        return failed

    def step(self, ride: Group | None = None) -> tuple[list[DecodedToken], mx.array | None]:
        """A row that reaches its budget or a stop token leaves the batch, its cache kept
        for ``take_finished``. ``ride``: a prompt chunk computed in the same forward pass
        (the accelerator's ``fused_hidden``); its final hidden states are returned, lazily."""
        self._admit_joining()
        if not self._rows or self._inputs is None or self._tops is None:
            return [], None
        fed, fed_tops = self._inputs, self._tops
        tokens = self._with_forced_run(fed) if ride is None else fed[:, None]
        logits, ridden = self._forward(Group(tokens, self._caches), ride)
        return self._sampled(logits, fed, fed_tops), ridden

    def _with_forced_run(self, fed: mx.array) -> mx.array:
        """A lone constrained row's input, then the tokens its grammar allows alone after
        it (a call's ``", "arguments": {"city": "``): one pass computes them all, where
        each was a step; the row's next token is sampled after the last. Only alone: the
        rows of one pass are fed as many tokens each."""
        row = self._rows[0] if len(self._rows) == 1 else None
        if not self._forced_runs or row is None or row.matcher is None or row.matcher.done:
            return fed[:, None]
        token = _ints(fed)[0]
        if row.has_output:  # else told at prefill, and reported already
            row.matcher.accept(token)
        row.told = True
        room = row.remaining - row.has_output
        if token not in self._stop and room > 0:
            row.run = row.matcher.take_forced(room)
        return mx.array([[token, *row.run]])

    def begin_step(self) -> PendingStep | None:
        """A step whose body is to run elsewhere (``PendingStep.body.run``, on another
        thread while this one slices a prompt); ``finish_step`` after it ran. None: no rows,
        or a body the accelerator cannot take, and nothing started (``step`` then)."""
        self._admit_joining()
        if not self._rows or self._inputs is None or self._tops is None or self._passes is None:
            return None
        if self._parts is None:
            return None
        fed, fed_tops = self._inputs, self._tops
        body = self._passes.prepare([Group(fed[:, None], self._caches)])
        return None if body is None else PendingStep(body, fed, fed_tops)

    def finish_step(self, pending: PendingStep) -> list[DecodedToken]:
        assert self._parts is not None  # begin_step started none without
        hidden = pending.body.finish()[0]
        logits = self._parts.head(hidden)[:, -1, :]
        return self._sampled(logits, pending.fed, pending.fed_tops)

    def _sampled(self, logits: mx.array, fed: mx.array, fed_tops: mx.array) -> list[DecodedToken]:
        """The tokens ``fed`` to this step, reported; the next ones sampled from
        ``logits`` (evaluated in the background while the caller goes on)."""
        if any(row.matcher is not None for row in self._rows):
            logits = self._constrained(logits, fed)
        self._inputs = self._sample(logits)
        self._tops = self._top_probs(logits)
        mx.async_eval(self._inputs, self._tops)  # type: ignore[no-untyped-call]  # mlx: unannotated
        mx.eval(fed, fed_tops)
        out: list[DecodedToken] = []
        done: list[int] = []
        rows = zip(self._rows, _ints(fed), _floats(fed_tops), strict=True)
        for index, (row, token, top) in enumerate(rows):
            reported = self._reported(row, token, top)
            row.has_output = True
            out += reported
            if reported and reported[-1].finished:
                done.append(index)
        for index, caches in zip(done, self._extract(done) if done else [], strict=True):
            self._finished[self._rows[index].seq_id] = caches
        self._drop(done)
        return out

    def _reported(self, row: _Row, token: int, top: float) -> list[DecodedToken]:
        """A row's input to this step (unless its prefill reported it), then its forced
        run (each the only token its mask allowed: a probability of 1), up to the one that
        finishes the row."""
        fed = [(token, top, False)] if row.has_output else []
        fed += [(forced, 1.0, True) for forced in row.run]
        row.told, row.run = False, ()
        out = []
        for fed_token, fed_top, forced in fed:
            row.remaining -= 1
            finished = row.remaining <= 0 or fed_token in self._stop
            shown_top = fed_top if row.track_top_prob else None
            out.append(DecodedToken(row.seq_id, fed_token, shown_top, finished, forced))
            if finished:
                break
        return out

    def _constrained(self, logits: mx.array, fed: mx.array) -> mx.array:
        """Constrained rows' grammars told the tokens fed to this step (sampled by the step
        before), then ``logits`` masked by what they allow next. The output head runs in
        the background meanwhile, so the masks cost the other rows no wait of their own."""
        mx.async_eval(logits)  # type: ignore[no-untyped-call]  # mlx: unannotated
        mx.eval(fed)
        matchers: list[GrammarMatcher | None] = []
        for row, token in zip(self._rows, _ints(fed), strict=True):
            matcher = row.matcher
            if matcher is not None and row.has_output and not row.told:  # else told already
                matcher.accept(token)
            fed_now = (*((token,) if row.has_output else ()), *row.run)
            leaving = bool(fed_now) and (
                row.remaining <= len(fed_now) or any(t in self._stop for t in fed_now)
            )
            matchers.append(None if matcher is None or matcher.done or leaving else matcher)
        return masked(logits, matchers)

    def _forward(self, mine: Group, ride: Group | None) -> tuple[mx.array, mx.array | None]:
        """The batch's next-token logits, and the ride's final hidden states (lazily)."""
        groups = [mine] if ride is None else [mine, ride]
        hidden = self._passes.hidden(groups) if self._passes is not None else None
        if hidden is None and ride is None:
            return self._model(mine.tokens, cache=mine.caches)[:, -1, :], None
        if hidden is None:
            if self._passes is None:
                raise TypeError("a prompt chunk rides a decode step only with an accelerator")
            hidden = self._passes.fused_hidden(groups)
        if self._parts is None:
            raise TypeError("only a llama model's decode step can carry a prompt chunk")
        return self._parts.head(hidden[0])[:, -1, :], hidden[1] if ride is not None else None

    def take_finished(self, seq_id: str) -> list[Any] | None:
        """The cache of a row that left the batch by itself, once."""
        return self._finished.pop(seq_id, None)

    def prefix_of(self, seq_id: str, n_tokens: int) -> list[Any] | None:
        """A row's first ``n_tokens`` positions as plain caches that view the batch's
        buffers (copy them before the next step), or a joining row's own caches; None while
        a joining row's cache is still to be built, or for a batch cache of another kind."""
        for row, caches, _ in self._joining:
            if row.seq_id == seq_id:
                return None if callable(caches) else caches
        index = next((i for i, row in enumerate(self._rows) if row.seq_id == seq_id), None)
        if index is None or not all(type(layer) is BatchKVCache for layer in self._caches):
            return None
        views = []
        for layer in self._caches:
            start = int(layer.left_padding[index].item())
            view = KVCache()  # type: ignore[no-untyped-call]  # mlx-lm: unannotated
            view.keys = layer.keys[index : index + 1, :, start : start + n_tokens]
            view.values = layer.values[index : index + 1, :, start : start + n_tokens]
            view.offset = n_tokens
            views.append(view)
        return views

    def builds_pending(self, seq_id: str) -> bool:
        """Whether the row joins at the next step with a cache still to be built."""
        return any(row.seq_id == seq_id and callable(c) for row, c, _ in self._joining)

    def remove(self, seq_id: str, *, build: bool = True) -> list[Any]:
        """Take a row out now (the engine ended it); returns its cache (``build=False``:
        a joining row's cache is not built, and nothing is returned for it)."""
        for position, (row, caches, _) in enumerate(self._joining):
            if row.seq_id == seq_id:  # never fed: its cache is still its own
                del self._joining[position]
                return _built(caches) if build else []
        index = next(i for i, row in enumerate(self._rows) if row.seq_id == seq_id)
        caches = self._extract([index])[0]
        self._drop([index])
        return caches

    def _sample(self, logits: mx.array) -> mx.array:
        """Rows sharing one sampler (all greedy ones do) are sampled in one call."""
        samplers = [row.sampler for row in self._rows]
        if all(s is samplers[0] for s in samplers):
            return samplers[0](logits)
        return mx.concatenate([s(logits[i : i + 1]) for i, s in enumerate(samplers)])

    def _top_probs(self, logits: mx.array) -> mx.array:
        """Normalising costs an ``exp`` per vocabulary entry: only for rows that asked."""
        tracked = [i for i, row in enumerate(self._rows) if row.track_top_prob]
        if not tracked:
            return mx.zeros((len(self._rows),))
        if len(tracked) == len(self._rows):
            return top_prob(logits)
        where = mx.array(tracked)
        return mx.zeros((len(self._rows),)).at[where].add(top_prob(logits[where]))

    def _extract(self, indices: list[int]) -> list[list[Any]]:
        """The leaving rows' caches; the last row's are its buffers, not a copy (every
        caller drops the rows right after)."""
        mine = handed_back(self._caches) if len(self._rows) == 1 else None
        return [mine] if mine is not None else extracted_rows(self._caches, indices)

    def _drop(self, indices: list[int]) -> None:
        if not indices:
            return
        gone = set(indices)
        keep = [i for i in range(len(self._rows)) if i not in gone]
        self._rows = [self._rows[i] for i in keep]
        if not keep:
            self._caches, self._inputs, self._tops = [], None, None
            return
        for layer in self._caches:
            layer.filter(keep)
        where = mx.array(keep)
        if self._inputs is not None and self._tops is not None:
            self._inputs, self._tops = self._inputs[where], self._tops[where]


def _built(caches: Caches) -> list[Any]:
    return caches() if callable(caches) else caches


def _ints(array: mx.array) -> list[int]:
    values = array.tolist()
    if not isinstance(values, list):
        raise TypeError("expected a 1-D array of token ids")
    return [int(v) for v in values]  # type: ignore[arg-type]  # elements of a 1-D list: numbers


def _floats(array: mx.array) -> list[float]:
    values = array.tolist()
    if not isinstance(values, list):
        raise TypeError("expected a 1-D array of probabilities")
    return [float(v) for v in values]  # type: ignore[arg-type]  # elements of a 1-D list: numbers
