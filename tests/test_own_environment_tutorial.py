"""docs/own_environment.md runs as written and does what it says.

The page's ``python`` blocks are the tutorial's only copy of its code: the fixture below executes
them in order, in one module namespace (as a user's script would), so the page cannot drift from
working code; a failing block's traceback points at the page's own line numbers. The tests then
check the page's claims on the objects it built: both env checkers pass, the single and vector envs
of the family agree, its exact model agrees with its kernels, training changes θ and improves the
return, save/load round-trips, and what the page says about reproducibility and about ids holds.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

from fedrl_algos import FedAvgPG, PerFedAvgPG
from fedrl_algos.core import KernelSampler
from fedrl_algos.core.exact import TabularEvaluator
from fedrl_algos.policies import TabularPolicy
from fedrl_envs import FamilyVectorEnv, RandomStreams, derive_keys, stack_params
from fedrl_wrappers import FederatedVecEnv

PAGE = Path(__file__).resolve().parent.parent / "docs" / "own_environment.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
PAGE_IDS = ("tutorial/Thermostat-v0", "tutorial/Chain-v0")


def page_blocks() -> list[tuple[int, str]]:
    """Every ``python`` block of the page with the line number its code starts on."""
    text = PAGE.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start(1)), m.group(1)) for m in BLOCK.finditer(text)]


@pytest.fixture(scope="module")
def page():
    """The namespace left by running every block of the page, in order."""
    module = types.ModuleType("own_environment_tutorial")
    # Registered like a user's module, so that save/load pickles the page's family by reference.
    sys.modules[module.__name__] = module
    try:
        for first_line, code in page_blocks():
            # Padding with newlines keeps the page's line numbers in tracebacks.
            exec(compile("\n" * first_line + code, str(PAGE), "exec"), module.__dict__)
        yield module.__dict__
    finally:
        del sys.modules[module.__name__]
        for env_id in PAGE_IDS:
            gym.registry.pop(env_id, None)


def test_the_page_has_the_blocks_this_test_relies_on():
    code = "\n".join(block for _, block in page_blocks())
    for needle in ("class Thermostat", "class ChainFamily", "gym.register(CHAIN.env_id", "check_env(", "sb3_check_env(",
                   "PerFedAvgPG(", "MFPO(", 'vectorization_mode="async"', ".save(", ".load("):
        assert needle in code, needle
    family_block = next(block for _, block in page_blocks() if "class ChainFamily" in block)
    assert len(family_block.splitlines()) < 100  # the page says "in under 100 lines"


def test_both_env_checkers_pass_on_both_envs(page):
    # Through gym.make, so that Gymnasium's checker finds the spec; both checkers on the raw env.
    for env_id, kwargs in (("tutorial/Thermostat-v0", {"outside": 2.0, "leak": 0.3}), ("tutorial/Chain-v0", {"goal": 0, "length": 3, "horizon": 4})):
        check_env(gym.make(env_id, **kwargs).unwrapped)
        sb3_check_env(gym.make(env_id, **kwargs).unwrapped)
    for task in page["CHAIN"].train_tasks + page["CHAIN"].heldout_tasks:
        check_env(page["CHAIN"].make_env(task).unwrapped)


def test_the_gymnasium_federation_learned(page):
    model, agents = page["model"], page["agents"]
    untrained = FedAvgPG("MlpPolicy", "tutorial/Thermostat-v0", agent_kwargs=agents, seed=0)
    assert not torch.equal(model.theta, untrained.theta)
    assert page["after"] > page["before"] + 1.0, (page["before"], page["after"])  # about -6.3 → -3.7
    assert not torch.equal(page["personal"].theta.detach(), model.theta)
    actions, _ = model.predict(torch.tensor([[-1.0], [1.5]]), deterministic=True)  # a batch, as torch
    assert actions.tolist() == [1, 0]  # heat the cold room, not the warm one
    assert np.isfinite(page["mean_return"]) and page["mean_return"] <= 0.0


def test_splitting_learn_is_one_run_and_load_continues_the_gymnasium_envs(page, tmp_path):
    kwargs = dict(agent_kwargs=page["agents"], local_steps=1, n_trajectories=16, seed=3)
    once = FedAvgPG("MlpPolicy", "tutorial/Thermostat-v0", **kwargs).learn(total_rounds=2)
    twice = FedAvgPG("MlpPolicy", "tutorial/Thermostat-v0", **kwargs).learn(total_rounds=1)
    twice.save(tmp_path / "half.zip")
    twice.learn(total_rounds=1, reset_num_timesteps=False)
    assert torch.equal(once.theta, twice.theta)
    # The page says: continuing after load is bitwise the uninterrupted run, the envs' generators
    # being in the file (the Thermostat draws its start temperature from np_random).
    resumed = FedAvgPG.load(tmp_path / "half.zip", device="cpu").learn(total_rounds=1, reset_num_timesteps=False)
    assert torch.equal(resumed.theta, once.theta)


def test_the_single_and_vector_env_of_the_family_agree_step_by_step(page):
    chain, task = page["CHAIN"], page["CHAIN"].make_params(goal=2, length=5, horizon=3)
    single = page["ChainEnv"](**chain.task_kwargs(task))
    vector = FamilyVectorEnv(chain, [task], n_envs=1, seed=7)
    obs, _ = single.reset(seed=7)
    vobs, _ = vector.reset()
    assert obs == int(vobs[0])
    actions = torch.randint(0, 2, (14,), generator=torch.Generator().manual_seed(0))
    for action in actions:  # 14 steps: three episode ends and their resets
        obs, reward, terminated, truncated, _ = single.step(int(action))
        if terminated or truncated:
            obs, _ = single.reset()
        vobs, vreward, vterminated, vtruncated, _ = vector.step(action.reshape(1))
        assert (obs, reward, terminated, truncated) == (int(vobs[0]), float(vreward[0]), bool(vterminated[0]), bool(vtruncated[0]))


def test_the_exact_model_agrees_with_rollouts_of_the_kernels(page):
    chain = page["CHAIN"]
    policy = TabularPolicy(gym.spaces.Discrete(8), gym.spaces.Discrete(2), dtype=torch.float64)
    theta = torch.randn(3, policy.theta.numel(), dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    exact = TabularEvaluator(chain, gamma=0.9).returns(theta).diagonal()  # agent i under its own θ_i
    sampler = KernelSampler(chain, stack_params(chain.train_tasks), policy, RandomStreams(derive_keys(0, torch.arange(3))))
    returns = sampler(theta, 20000).returns(0.9)  # [3, m]
    z = (returns.mean(-1) - exact) / (returns.std(-1) / returns.shape[-1] ** 0.5)
    assert bool((z.abs() < 4.5).all()), z


def test_per_fedavg_pg_trained_and_personalizes_to_held_out_goals(page):
    meta, chain, exact = page["meta"], page["CHAIN"], page["exact"]
    assert not torch.equal(meta.theta, PerFedAvgPG("TabularPolicy", chain, seed=0, device="cpu").theta)
    trained = exact.returns(meta.theta.double())
    assert bool((trained > page["meta_start"]).all())
    assert float(page["F"]) > float(page["f"])  # one adaptation step from the learned init helps
    heldout = TabularEvaluator(chain, gamma=meta.gamma, tasks=chain.heldout_tasks)
    personal = torch.stack([p.theta.detach() for p in page["personal_goals"]]).double()
    adapted = heldout.returns(personal).diagonal()  # held-out goal k under the policy adapted to it
    assert bool((adapted > heldout.returns(meta.theta.double())).all())


def test_mfpo_trained_and_round_trips(page):
    mfpo, again = page["mfpo"], page["again"]
    assert mfpo.evaluator is not None and "exact_return" in mfpo.evaluate_round()  # the exact model is used
    assert torch.equal(again.theta, mfpo.theta) and again.family.env_id == "tutorial/Chain-v0"
    assert again.rounds_done == mfpo.rounds_done == 6


def test_an_id_registered_with_the_familys_vector_env_is_that_family(page):
    # What the page's last section says.
    import fedrl_envs

    assert fedrl_envs.family_of("tutorial/Chain-v0") is page["CHAIN"]
    env = FederatedVecEnv("tutorial/Chain-v0", 2, agent_kwargs=[{"goal": 5}], seed=0)
    assert env.backend == "native"
    env.close()
    by_id = PerFedAvgPG("TabularPolicy", "tutorial/Chain-v0", agent_kwargs=[{"goal": 5}], seed=0, device="cpu")
    assert not by_id.is_generic and by_id.evaluator is not None
    by_object = PerFedAvgPG("TabularPolicy", page["CHAIN"], agent_kwargs=[{"goal": 5}], seed=0, device="cpu")
    assert torch.equal(by_id.learn(total_rounds=1).theta, by_object.learn(total_rounds=1).theta)
    assert fedrl_envs.family_of("tutorial/Thermostat-v0") is None  # only an entry_point: a Gymnasium id
