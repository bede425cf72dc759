"""The decoding sequences' one-token steps, batched in mlx-lm's batch caches.

mlx-lm's ``BatchGenerator`` normalises every sequence's logits over the whole vocabulary on
every step (a log-sum-exp: 13 of the 108 ms a 16-sequence step takes here, since MLX's CPU
``exp`` is slow), runs a separate forward pass for each newcomer's first input token, and
keeps its next step in flight, so a finished sequence's cache holds one position more than
its tokens. This batch keeps mlx-lm's caches (``BatchKVCache`` and its kin: left-padded
merge, extend, extract, filter) and its model, but samples from raw logits, normalises only
the rows that need it (nucleus sampling, a top-token probability), and lets a newcomer's
first token ride the next shared step. ADR 0011 has the measurements. A constrained row
keeps caches of its own, stepped as a group of its own in the same pass, so that it may be
fed its grammar's forced runs (``decode_rows``, ADR 0017).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import mlx.core as mx

from semantic.adapters.mlx.accelerator import Group, Passes, PendingStep
from semantic.adapters.mlx.decode_rows import Row, hold_logprobs
from semantic.adapters.mlx.kv.batch_caches import (
    adopted,
    extracted_rows,
    handed_back,
    merged_layer,
    row_views,
    views,
)
from semantic.adapters.mlx.lm import KVCache
from semantic.adapters.mlx.logprobs import arrays_of
from semantic.adapters.mlx.models.model_parts import BodyAndHead
from semantic.adapters.mlx.sampling import Sampler, draws_every_token, sampled_rows, top_probs
from semantic.adapters.mlx.token_mask import masked
from semantic.ports.grammar import GrammarMatcher
from semantic.ports.model_backend import DecodedToken

Caches = list[Any] | Callable[[], list[Any]]
"""A sequence's per-layer caches (mlx-lm leaves them untyped), or what builds them."""


class DecodeBatch:
    """Each ``step`` runs one pass that feeds every row its newest token and samples the
    next, and reports the tokens the previous pass sampled. So a row's cache always holds
    every token it has reported (a finished sequence keeps its final token's KV, and a
    client sending the reply back hits all of it), at no extra pass. Rows of the shared
    batch cache come first, then the rows with caches of their own."""

    def __init__(
        self,
        model: Any,
        stop_tokens: Iterable[int],
        passes: Passes | None = None,
        *,
        forced_runs: bool = True,
        pass_rows: int = 0,
    ) -> None:
        """``passes``: an accelerator's (``accelerator.py``), which may take a pass off
        MLX or carry a prompt chunk along; without it, every pass is mlx-lm's own.
        ``forced_runs``: constrained rows are fed their forced runs, in caches of their own
        where ``passes`` can step several groups in one pass (False: tests compare).
        ``pass_rows``: the rows a pass of several groups takes (the accelerator's
        ``ride_rows``: runs stay within, so a row's products run on the kernels that give
        the same bits at any batch size, ADR 0010); 0: no such pass, and only a row alone in
        the batch takes runs."""
        self._model = model
        self._passes = passes
        self._parts = BodyAndHead.of(model)
        self._forced_runs = forced_runs
        self._pass_rows = pass_rows
        self._stop = frozenset(stop_tokens)
        self._rows: list[Row] = []
        self._caches: list[Any] = []  # one batch cache per layer; mlx-lm leaves them untyped
        self._inputs: mx.array | None = None  # (rows,): each row's next input token
        self._tops: mx.array | None = None  # (rows,): its probability, for tracked rows
        self._finished: dict[str, list[Any]] = {}
        self._joining: list[tuple[Row, Caches, int]] = []
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
        logprobs: int | None = None,
    ) -> None:
        """Join with a prefilled cache; ``first_token`` is fed at the next pass, which makes
        the first of at most ``max_new_tokens`` new tokens. Newcomers are merged into the
        batch together at the next step: one copy of the batch's caches, not one each (a
        constrained row may keep its own, ``_keeps_apart``).
        ``caches`` may be a function that builds them, called at that step. ``matcher``:
        the row's grammar, which has already accepted ``first_token``."""
        row = Row(
            seq_id, sampler, track_top_prob, max_new_tokens, matcher=matcher, logprobs=logprobs
        )
        self._joining.append((row, caches, first_token))

    def _admit_joining(self) -> None:
        if not self._joining:
            return
        joining, built = self._build_joining()
        if not joining:
            return
        shared, apart = [], []
        for (row, _, first), caches in zip(joining, built, strict=True):
            if self._keeps_apart(row, caches):
                row.own = caches
                apart.append((row, first))
            else:
                shared.append((row, first, caches))
        if shared:
            self._merge([caches for _, _, caches in shared])
        n_shared = self._n_shared()
        self._inputs = _spliced(
            self._inputs, n_shared, [f for _, f, _ in shared], [f for _, f in apart]
        )
        self._tops = _spliced(self._tops, n_shared, [0.0] * len(shared), [0.0] * len(apart))
        before, after = self._rows[:n_shared], self._rows[n_shared:]
        self._rows = [*before, *(r for r, _, _ in shared), *after, *(r for r, _ in apart)]

    def _keeps_apart(self, row: Row, caches: list[Any]) -> bool:
        """A constrained row keeps its own plain caches where one pass steps several
        groups (the accelerator's, a llama body): its forced runs need a group of its own."""
        if not self._forced_runs or row.matcher is None or not self._pass_rows:
            return False
        plain = all(type(c) is KVCache and c.keys is not None for c in caches)
        return plain and self._parts is not None

    def _merge(self, built: list[list[Any]]) -> None:
        lone = adopted(built[0]) if not self._caches and len(built) == 1 else None
        merged = lone or [merged_layer(layers) for layers in zip(*built, strict=True)]
        if self._caches:
            for mine, theirs in zip(self._caches, merged, strict=True):
                mine.extend(theirs)
        else:
            self._caches = merged

    def _n_shared(self) -> int:
        return sum(row.own is None for row in self._rows)

    def _build_joining(self) -> tuple[list[tuple[Row, Caches, int]], list[list[Any]]]:
        """The newcomers whose caches could be built, and those caches. One that fails (no
        memory to gather a restored prefix, say) is left out and noted for
        ``take_failed``, so it fails alone instead of failing the whole step."""
        joining, self._joining = self._joining, []
        admitted: list[tuple[Row, Caches, int]] = []
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
        if ride is None:
            self._take_runs(fed)
        logits, ridden = self._forward(self._groups(fed), ride)
        return self._sampled(logits, fed, fed_tops), ridden

    def _take_runs(self, fed: mx.array) -> None:
        """Each constrained row alone in its cache takes its forced run, within the rows
        one pass takes on the accelerator."""
        n_shared = self._n_shared()
        lone = [
            row
            for index, row in enumerate(self._rows)
            if row.matcher is not None
            and not row.matcher.done
            and row.logprobs is None
            and not draws_every_token(row.sampler)
            and (row.own is not None or n_shared == 1 == index + 1)
        ]
        if not self._forced_runs or not lone:
            return
        tokens = dict(zip((row.seq_id for row in self._rows), _ints(fed), strict=True))
        room = self._pass_rows - len(self._rows) if self._pass_rows else 1 << 30
        for row in lone:
            room -= len(row.take_run(tokens[row.seq_id], self._stop, max(room, 0)))

    def _groups(self, fed: mx.array) -> list[Group]:
        """The shared cache's rows as one group, then each row with caches of its own."""
        n_shared = self._n_shared()
        groups = [Group(self._fed(fed, 0, n_shared), self._caches)] if n_shared else []
        for index in range(n_shared, len(self._rows)):
            own = self._rows[index].own
            assert own is not None  # the rows after the shared ones have their own
            groups.append(Group(self._fed(fed, index, index + 1), own))
        return groups

    def _fed(self, fed: mx.array, start: int, end: int) -> mx.array:
        """Rows ``start:end``'s tokens ``(rows, length)``: one each, or one row's run."""
        run = self._rows[start].run if end == start + 1 else ()
        if not run:
            return fed[start:end, None]
        return mx.concatenate([fed[start:end], mx.array(run, dtype=fed.dtype)])[None]

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
        body = self._passes.prepare(self._groups(fed))
        return None if body is None else PendingStep(body, fed, fed_tops)

    def finish_step(self, pending: PendingStep) -> list[DecodedToken]:
        return self._sampled(self._head(pending.body.finish()), pending.fed, pending.fed_tops)

    def _sampled(self, logits: mx.array, fed: mx.array, fed_tops: mx.array) -> list[DecodedToken]:
        """The tokens ``fed`` to this step, reported; the next ones sampled from
        ``logits`` (evaluated in the background while the caller goes on)."""
        if any(row.matcher is not None for row in self._rows):
            logits = self._constrained(logits, fed)
        fed_logprobs = [row.pending for row in self._rows]
        self._inputs = sampled_rows(logits, [row.sampler for row in self._rows])
        self._tops = top_probs(logits, [row.track_top_prob for row in self._rows])
        pending = hold_logprobs(self._rows, logits, self._inputs)
        mx.async_eval(self._inputs, self._tops, *pending)  # type: ignore[no-untyped-call]  # mlx: unannotated
        mx.eval(fed, fed_tops, *arrays_of(fed_logprobs))
        out: list[DecodedToken] = []
        done: list[int] = []
        rows = zip(self._rows, _ints(fed), _floats(fed_tops), fed_logprobs, strict=True)
        for index, (row, token, top, logprob) in enumerate(rows):
            reported = row.reported(token, top, self._stop, logprob)
            out += reported
            if reported and reported[-1].finished:
                done.append(index)
        for index, caches in zip(done, self._extract(done) if done else [], strict=True):
            self._finished[self._rows[index].seq_id] = caches
        self._drop(done)
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
            leaving = row.leaving(token, self._stop)
            matchers.append(None if matcher is None or matcher.done or leaving else matcher)
        return masked(logits, matchers)

    def _forward(self, groups: list[Group], ride: Group | None) -> tuple[mx.array, mx.array | None]:
        """The rows' next-token logits, and the ride's final hidden states (lazily)."""
        passed = groups if ride is None else [*groups, ride]
        hidden = self._passes.hidden(passed) if self._passes is not None else None
        if hidden is None and len(passed) == 1:
            return self._model(groups[0].tokens, cache=groups[0].caches)[:, -1, :], None
        if hidden is None:
            if self._passes is None:
                raise TypeError("several groups share a decode step only with an accelerator")
            hidden = self._passes.fused_hidden(passed)
        return self._head(hidden[: len(groups)]), hidden[-1] if ride is not None else None

    def _head(self, hidden: list[mx.array]) -> mx.array:
        """The rows' next-token logits from each group's final hidden states: its last
        position's (a row fed a run has several)."""
        if self._parts is None:
            raise TypeError("only a llama model's decode step runs off mlx-lm's forward")
        last = [h[:, -1:, :] for h in hidden]
        logits: mx.array = self._parts.head(last[0] if len(last) == 1 else mx.concatenate(last))
        return logits[:, -1, :]

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
        if index is None:
            return None
        own = self._rows[index].own
        return row_views(self._caches, index, n_tokens) if own is None else views(own, n_tokens)

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

    def _extract(self, indices: list[int]) -> list[list[Any]]:
        """The leaving rows' caches: their own, or cut from the shared cache, whose last
        row's are its buffers, not a copy (every caller drops the rows right after)."""
        shared = [i for i in indices if self._rows[i].own is None]
        mine = handed_back(self._caches) if shared and self._n_shared() == 1 else None
        cut = [mine] if mine is not None else extracted_rows(self._caches, shared) if shared else []
        by_index = dict(zip(shared, cut, strict=True))
        return [_own_or(self._rows[i].own, by_index, i) for i in indices]

    def _drop(self, indices: list[int]) -> None:
        if not indices:
            return
        gone = set(indices)
        keep = [i for i in range(len(self._rows)) if i not in gone]
        n_shared = self._n_shared()
        shared_kept = [i for i in keep if i < n_shared]  # the shared rows come first
        if not shared_kept:
            self._caches = []
        elif len(shared_kept) < n_shared:
            for layer in self._caches:
                layer.filter(shared_kept)
        self._rows = [self._rows[i] for i in keep]
        if not keep:
            self._inputs, self._tops = None, None
            return
        where = mx.array(keep)
        if self._inputs is not None and self._tops is not None:
            self._inputs, self._tops = self._inputs[where], self._tops[where]


def _built(caches: Caches) -> list[Any]:
    return caches() if callable(caches) else caches


def _spliced(array: mx.array | None, at: int, inserted: list[Any], appended: list[Any]) -> mx.array:
    """``array`` with ``inserted`` put in at ``at`` and ``appended`` after the end."""
    parts = [] if array is None else [array[:at]]
    parts += [mx.array(inserted)] if inserted else []
    parts += [] if array is None else [array[at:]]
    parts += [mx.array(appended)] if appended else []
    return mx.concatenate(parts)


def _own_or(own: list[Any] | None, cut: dict[int, list[Any]], index: int) -> list[Any]:
    return own if own is not None else cut[index]


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
