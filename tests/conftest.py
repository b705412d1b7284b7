"""Fixtures the estimator test modules share: the paper's gridworld, its tabular policy and its exact evaluator.

(The session-wide settings, such as where tests write, are in the repository's top-level conftest.py.)
"""

import gymnasium as gym
import pytest
import torch

from fedrl_algos.core.exact import TabularEvaluator
from fedrl_algos.policies import TabularPolicy
from fedrl_envs import GRIDWORLD, stack_params

#: the discount the estimator tests evaluate with (their modules' GAMMA)
GRID_GAMMA = 0.9


@pytest.fixture(scope="module")
def tabular():
    """The softmax tabular policy on the 5 × 5 gridworld (25 states, 4 actions), float64."""
    return TabularPolicy(gym.spaces.Discrete(25), gym.spaces.Discrete(4), dtype=torch.float64)


@pytest.fixture(scope="module")
def grid_params():
    """The 8 training goals' parameters, stacked."""
    return stack_params(GRIDWORLD.train_tasks)


@pytest.fixture(scope="module")
def evaluator():
    """Exact DP over the 8 training goals at γ = 0.9."""
    return TabularEvaluator("fedrl/GridWorld-v0", gamma=GRID_GAMMA)
