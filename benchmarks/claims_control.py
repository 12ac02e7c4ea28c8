"""Claim (f): a Decision Transformer's achieved return follows the return it is asked for.

`configs/dt/cartpole.yaml` trains dt-small for 1,000 steps on the built-in CartPole-v1
episodes of mixed quality (expert, noisy expert, random: returns 9 … 500). The trained policy
is then rolled out at targets 100, 200, 300 and 400 on fresh episodes — start states from
seeds the recipe's validation rollouts never use — with the recipe's action choice (argmax)
and, printed beside it, with actions sampled from the policy's softmax. One claim a target:
the mean over seeds of |achieved − target| / target is at most 20 %. One training a seed
serves the four claims.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from claim import Claim, finite, fit_recipe, not_a_script

RECIPE = "dt/cartpole"
TARGETS = (100, 200, 300, 400)
EPISODES = 20
BOUND = 20.0  # % of the target


def eval_seed(seed: int) -> int:
    """Where seed ``seed``'s evaluation episodes start: away from the recipe's (10,000 + e)."""
    return 50_000 + 1_000 * seed


@functools.cache
def rollouts(seed: int) -> dict[str, dict[float, float]]:
    """Train the recipe once for ``seed`` -> {"argmax" / "sampled": {target: mean achieved return}}."""
    cli, _ = fit_recipe(RECIPE, ["--model.init_args.eval_episodes", "0"], seed=seed, test=False)
    if cli.model.hparams.eval_sample is not False:
        raise RuntimeError(f"{RECIPE} no longer rolls out with argmax actions: update this claim")
    model = cli.model.model
    return {name: model.evaluate("CartPole-v1", list(TARGETS), episodes=EPISODES, seed=eval_seed(seed),
                                 sample=sample).mean_returns()
            for name, sample in (("argmax", False), ("sampled", True))}


def error(achieved: float, target: float) -> float:
    """|achieved − target| as a percentage of the target."""
    return 100 * abs(achieved - target) / target


def run_for(target: int) -> Callable[[int], dict[str, float]]:
    def run(seed: int) -> dict[str, float]:
        means = rollouts(seed)
        argmax, sampled = means["argmax"][float(target)], means["sampled"][float(target)]
        return finite({"argmax actions": error(argmax, target), "sampled actions": error(sampled, target),
                       "achieved (argmax)": argmax, "achieved (sampled)": sampled})
    return run


CLAIMS = [
    Claim(key=f"f-{target}", title=f"Decision Transformer return follows the target: {target}",
          metric="|achieved − target| / target (%)", better="argmax actions", run=run_for(target),
          higher_is_better=False, bound=BOUND,
          data=f"{EPISODES} fresh CartPole-v1 episodes a target (start seeds unused by the recipe's validation); "
               "1,000 steps of configs/dt/cartpole.yaml",
          extra=("sampled actions", "achieved (argmax)", "achieved (sampled)"))
    for target in TARGETS
]


if __name__ == "__main__":
    not_a_script(CLAIMS)
