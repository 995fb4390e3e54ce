"""Search strategies over a step's candidates: propose the next trial, observe its result.

- GridSearch proposes every candidate once, in the order given (the tuner orders them by the
  performance model's predicted throughput, best first, so an interrupted grid has already run the
  likeliest winners).
- BayesSearch is Optuna's TPE sampler (seeded, with the constant liar so that proposals asked
  together before any is measured differ) over the step's parameters as categorical dimensions. The tuner first spends half the budget on the performance model's best predictions
  (re-predicted after each trial) and tells TPE their results; TPE proposes the rest. A
  proposal that is not a candidate (excluded as predicted out of memory) is told to Optuna as
  infeasible (value 0) without running; one already measured is told its measured value again.
  Trials reused from an interrupted tune are added to the study first, so a resumed search knows
  what was measured.
Values are samples/s (higher is better); a failed or out-of-memory trial is worth 0.
"""
from __future__ import annotations

import math
from typing import Optional

from ..config.choices import SearchStrategy
from ..config.tune_schema import TuneConfig
from .space import Candidate

MAX_REDUNDANT_ASKS = 200
"""BayesSearch stops after this many proposals in a row that ran nothing (all seen or excluded)."""


def choose(tune: TuneConfig, num_candidates: int) -> tuple[SearchStrategy, int]:
    """(strategy, budget) for a step with this many runnable candidates."""
    strategy = tune.strategy
    if strategy == SearchStrategy.auto:
        strategy = SearchStrategy.grid if num_candidates <= tune.grid_max else SearchStrategy.bayes
    if tune.budget:
        budget = tune.budget
    elif strategy == SearchStrategy.grid:
        budget = num_candidates
    else:
        budget = max(3, math.ceil(num_candidates / 4))
    return strategy, min(budget, num_candidates)


class GridSearch:
    def __init__(self, ordered: list[Candidate]):
        self.queue = list(ordered)
        self.seen: dict[str, Optional[float]] = {}

    def reserve(self, cand: Candidate) -> None:
        """Never propose it: it is being measured elsewhere (its value comes through observe)."""
        self.seen.setdefault(cand.key, None)

    def propose(self) -> Optional[Candidate]:
        while self.queue:
            cand = self.queue.pop(0)
            if cand.key not in self.seen:
                return cand
        return None

    def observe(self, cand: Candidate, value: float) -> None:
        self.seen[cand.key] = value


class BayesSearch:
    def __init__(self, candidates: list[Candidate], excluded: list[Candidate], seed: int):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        everything = candidates + excluded
        self.names = independent([k for k, _ in everything[0].params], everything)
        self.dists = {n: optuna.distributions.CategoricalDistribution(
            sorted({dict(c.params)[n] for c in everything}, key=repr)) for n in self.names}
        self.by_params = {self._key(c.params): c for c in candidates}
        self.excluded = {self._key(c.params) for c in excluded}
        self.seen: dict[tuple, float] = {}
        # one random start at most: the tuner's model-first trials (told through observe) come first;
        # constant liar: proposals asked together (a Slurm job array) avoid each other
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=1, constant_liar=True)
        self.study = optuna.create_study(direction="maximize", sampler=sampler)
        self.pending: dict[tuple, object] = {}
        self.reserved: set[tuple] = set()

    def reserve(self, cand: Candidate) -> None:
        """Never propose it: it is being measured elsewhere (its value comes through observe)."""
        self.reserved.add(self._key(cand.params))

    def _key(self, params: tuple) -> tuple:
        d = dict(params)
        return tuple((n, d[n]) for n in self.names)

    def _params(self, trial) -> tuple:
        return tuple((n, trial.suggest_categorical(n, self.dists[n].choices)) for n in self.names)

    def propose(self) -> Optional[Candidate]:
        """The next point; called several times before observing (a batch), never the same twice."""
        import optuna

        for _ in range(MAX_REDUNDANT_ASKS):
            trial = self.study.ask()
            params = self._params(trial)
            if params in self.excluded or params not in self.by_params:  # not runnable: infeasible
                self.study.tell(trial, 0.0)
            elif params in self.seen:
                self.study.tell(trial, self.seen[params])
            elif params in self.pending or params in self.reserved:  # proposed already, not measured yet
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                self.pending[params] = trial
                return self.by_params[params]
        return None

    def observe(self, cand: Candidate, value: float) -> None:
        import optuna

        key = self._key(cand.params)
        self.seen[key] = value
        trial = self.pending.pop(key, None)
        if trial is not None:
            self.study.tell(trial, value)
        else:  # reused from an interrupted tune: known before the search asked for it
            self.study.add_trial(optuna.trial.create_trial(
                params=dict(key), distributions=self.dists, value=value))


def independent(names: list[str], candidates: list[Candidate]) -> list[str]:
    """The dimensions Optuna samples: a parameter determined by the others (grad_acc_steps by
    micro_batch_size at fixed C) is dropped, so every sampled point is a real configuration."""
    kept = list(names)
    for n in names:
        rest = [m for m in kept if m != n]
        keys = {tuple((m, dict(c.params)[m]) for m in rest) for c in candidates}
        if rest and len(keys) == len({c.params for c in candidates}):
            kept = rest
    return kept


def make(strategy: SearchStrategy, candidates: list[Candidate], excluded: list[Candidate],
         ordered: list[Candidate], seed: int):
    """GridSearch over `ordered`, or BayesSearch over the candidates (the tuner spends the first half
    of a Bayesian budget on the model's fresh best predictions itself, and tells TPE the results)."""
    if strategy == SearchStrategy.grid:
        return GridSearch(ordered)
    return BayesSearch(candidates, excluded, seed)
