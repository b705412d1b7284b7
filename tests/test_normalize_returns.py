"""``normalize_returns``: every trajectory's returns-to-go standardised over its own running steps
(the MFPO authors' code; not an unbiased estimate of ∇J).

* :func:`normalize_episode_returns` against a loop over trajectories (batched = looped), masks respected
  (terminated episodes, a one-step episode, padded steps stay 0);
* :func:`normalized_return_rewards`: their returns-to-go are the normalised returns, so GPOMDP's
  weights with the option equal the hand-composed ``γ^h Ĝ^h − loo`` / ``Ĝ^h − loo``, and the critic's
  λ = 1 advantages are ``Ĝ^h − V``;
* default off changes nothing (bitwise); MFPO learns with it, alone and with the critic, saves and
  loads; bad values are refused naming the argument;
* FedAvgPG, IndependentPG and FedPGBR: default off is bitwise today's round; with it on, two rounds
  equal two rounds of the model without it whose estimator is fed trajectories with the rewards of
  :func:`normalized_return_rewards` (the hand computation); REINFORCE and non-bools are refused;
  save/load keeps it and older files load with it off; with ``baseline="critic"`` (FedAvgPG) the
  critic's λ = 1 weights and regression targets are the normalised returns and the fitted critics'
  output means are theirs (0).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from gymnasium.spaces import Discrete

from fedrl_algos import MFPO, FedAvgPG, FedPGBR, IndependentPG
from fedrl_algos.core.critic import CriticGradient, critic_step_weights
from fedrl_algos.core.directions import PolicyGradient
from fedrl_algos.core.estimators import relative_rewards_to_go
from fedrl_algos.core.gpomdp import (
    ScoreFunctionGradient,
    gpomdp_weights,
    normalize_episode_returns,
    normalize_step_weights,
    normalized_return_rewards,
    step_weights,
    time_baseline,
)
from fedrl_algos.core.trajectories import Trajectories
from fedrl_algos.fedpg_br.update import FedPGBRUpdate
from fedrl_algos.mfpo.update import MFPOUpdate
from fedrl_algos.policies import TabularPolicy

GAMMA = 0.9


def _traj(rows: int = 3, m: int = 5, horizon: int = 7, seed: int = 0) -> Trajectories:
    gen = torch.Generator().manual_seed(seed)
    mask = torch.ones(rows, m, horizon, dtype=torch.float64)
    mask[0, 1, 3:] = 0  # terminated after 3 steps
    mask[1, 2, 1:] = 0  # one running step
    mask[2, :, 5:] = 0
    rewards = torch.randn(rows, m, horizon, dtype=torch.float64, generator=gen) * mask
    rewards[1] = rewards[1] * 100.0 - 500.0 * mask[1]  # a row on Pendulum's scale
    states = torch.randint(0, 4, (rows, m, horizon), generator=gen)
    actions = torch.randint(0, 2, (rows, m, horizon), generator=gen)
    return Trajectories(states, actions, rewards, mask)


def _looped(returns: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """One trajectory at a time, plain Python lists."""
    out = torch.zeros_like(returns)
    rows, m, _ = returns.shape
    for r in range(rows):
        for j in range(m):
            vals = [float(v) for v, k in zip(returns[r, j], mask[r, j], strict=True) if k > 0]
            mean = sum(vals) / len(vals)
            std = (sum((v - mean) ** 2 for v in vals) / len(vals)) ** 0.5
            for h, v in enumerate(vals):
                out[r, j, h] = (v - mean) / (std + eps)
    return out


def test_batched_equals_a_loop_over_trajectories_and_respects_masks():
    traj = _traj()
    returns = relative_rewards_to_go(traj.rewards, GAMMA)
    out = normalize_episode_returns(returns, traj.mask)
    torch.testing.assert_close(out, _looped(returns, traj.mask), rtol=1e-12, atol=1e-12)
    alive = traj.mask > 0
    assert (out[~alive] == 0).all()
    assert (out[1, 2] == 0).all()  # a one-step episode has no spread: 0, not 0/0
    # every episode with more than one running step has mean 0 and std 1 over its own steps
    for r, j in [(0, 0), (0, 1), (1, 0), (2, 4)]:
        vals = out[r, j][alive[r, j]]
        torch.testing.assert_close(vals.mean(), torch.tensor(0.0, dtype=torch.float64), rtol=0, atol=1e-12)
        torch.testing.assert_close(vals.std(unbiased=False), torch.tensor(1.0, dtype=torch.float64), rtol=1e-6, atol=0)
    # batched over leading axes: a [2, 3, ...] batch equals its rows one at a time
    stacked = torch.stack((returns, returns * 3.0 + 1.0))
    both = normalize_episode_returns(stacked, torch.stack((traj.mask, traj.mask)))
    torch.testing.assert_close(both[0], out)
    torch.testing.assert_close(both[1], out, rtol=1e-6, atol=1e-8)  # an affine map of the returns changes nothing


def test_rewards_whose_returns_to_go_are_the_normalised_returns():
    traj = _traj()
    r_hat = normalized_return_rewards(traj.rewards, traj.mask, GAMMA)
    expected = normalize_episode_returns(relative_rewards_to_go(traj.rewards, GAMMA), traj.mask)
    torch.testing.assert_close(relative_rewards_to_go(r_hat, GAMMA), expected, rtol=1e-10, atol=1e-10)
    assert (r_hat[traj.mask == 0] == 0).all()


@pytest.mark.parametrize("discounting", ["absolute", "relative"])
@pytest.mark.parametrize("baseline", ["loo", "mean", None])
def test_gpomdp_weights_use_the_normalised_returns(discounting, baseline):
    traj = _traj()
    g_hat = _looped(relative_rewards_to_go(traj.rewards, GAMMA), traj.mask)
    if discounting == "absolute":
        g_hat = g_hat * GAMMA ** torch.arange(traj.rewards.shape[-1], dtype=torch.float64)
    expected = (g_hat - time_baseline(g_hat, traj.mask, baseline)) * traj.mask
    got = step_weights(traj, GAMMA, "gpomdp", baseline, discounting, normalize_returns=True)
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)


def test_linear_baseline_is_fitted_to_the_normalised_returns():
    traj = _traj(m=8)
    obs = torch.randn(*traj.rewards.shape, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    traj = traj._replace(obs=obs)
    swapped = traj._replace(rewards=normalized_return_rewards(traj.rewards, traj.mask, GAMMA))
    torch.testing.assert_close(step_weights(traj, GAMMA, baseline="linear", normalize_returns=True),
                               gpomdp_weights(swapped, GAMMA, "linear"))


def test_critic_advantages_at_lambda_one_are_normalised_returns_minus_values():
    traj = _traj()
    values = torch.randn(traj.rewards.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    r_hat = normalized_return_rewards(traj.rewards, traj.mask, GAMMA)
    psi, targets = critic_step_weights(values, r_hat, traj.mask, GAMMA, 1.0, "relative")
    g_hat = _looped(relative_rewards_to_go(traj.rewards, GAMMA), traj.mask)
    torch.testing.assert_close(psi, (g_hat - values) * traj.mask, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(targets, g_hat, rtol=1e-9, atol=1e-9)  # the critic regresses on the normalised returns


def test_default_off_is_bitwise_the_old_estimator_and_reinforce_is_refused():
    traj = _traj()
    policy = TabularPolicy(Discrete(4), Discrete(2))
    featured = traj._replace(obs=traj.obs.unsqueeze(-1).double())  # the linear baseline's features need float observations
    for baseline in ("loo", "mean", "linear", None):
        batch = featured if baseline == "linear" else traj
        old = ScoreFunctionGradient(policy, GAMMA, 5, baseline=baseline, normalize_advantage=True)
        assert old.normalize_returns is False
        assert torch.equal(old.weights(batch), normalize_step_weights(gpomdp_weights(batch, GAMMA, baseline), batch.mask))
    assert torch.equal(step_weights(traj, GAMMA), gpomdp_weights(traj, GAMMA))
    # normalize_advantage divides the normalised-return weights afterwards (the order is fixed)
    both = ScoreFunctionGradient(policy, GAMMA, 5, normalize_advantage=True, normalize_returns=True).weights(traj)
    alive = traj.mask > 0
    assert abs(float(both[0][alive[0]].std(unbiased=False)) - 1.0) < 1e-6
    with pytest.raises(ValueError, match="normalize_returns"):
        ScoreFunctionGradient(policy, GAMMA, 5, estimator="reinforce", normalize_returns=True)
    with pytest.raises(TypeError, match="normalize_returns"):
        ScoreFunctionGradient(policy, GAMMA, 5, normalize_returns=1)
    with pytest.raises(ValueError, match="eps"):
        normalize_episode_returns(traj.rewards, traj.mask, eps=-1.0)


def _mfpo(**kwargs) -> MFPO:
    base = dict(step_size=0.5, local_steps=2, n_trajectories=4, seed=3, device="cpu")
    return MFPO("TabularPolicy", "fedrl/GridWorld-v0", **{**base, **kwargs})


def test_mfpo_direction_uses_the_normalised_weights():
    plain, normed = _mfpo(), _mfpo(normalize_returns=True)
    state = plain.state
    traj = plain.federation.sampler(state.theta, plain.initial_trajectories)
    swapped = traj._replace(rewards=normalized_return_rewards(traj.rewards, traj.mask, plain.gamma))
    _, d_normed, _ = normed.update.direction(lambda th, m: traj, state)
    _, d_swapped, _ = plain.update.direction(lambda th, m: swapped, state)
    torch.testing.assert_close(d_normed, d_swapped)
    _, d_plain, _ = plain.update.direction(lambda th, m: traj, state)
    assert not torch.allclose(d_plain, d_normed)


@pytest.mark.parametrize("baseline", ["loo", "critic"])
def test_mfpo_learns_saves_and_loads_with_it(tmp_path, baseline):
    model = _mfpo(normalize_returns=True, baseline=baseline)
    assert model.update.normalize_returns is True
    model.learn(total_rounds=2)
    assert torch.isfinite(model.policy.theta).all()
    model.save(tmp_path / "m.zip")
    loaded = MFPO.load(tmp_path / "m.zip", device="cpu")
    assert loaded.normalize_returns is True and loaded.update.normalize_returns is True
    # the same next round from the loaded model as from the original
    model.learn(total_rounds=1, reset_num_timesteps=False)
    loaded.learn(total_rounds=1, reset_num_timesteps=False)
    assert torch.equal(model.policy.theta, loaded.policy.theta)


def test_older_files_load_with_it_off(tmp_path):
    model = _mfpo()
    del model.__dict__["normalize_returns"]  # a file saved before the option existed
    model.save(tmp_path / "old.zip")
    loaded = MFPO.load(tmp_path / "old.zip", device="cpu")
    assert loaded.update.normalize_returns is False


def test_bad_values_name_the_argument():
    with pytest.raises(TypeError, match="normalize_returns"):
        _mfpo(normalize_returns="yes")
    with pytest.raises(ValueError, match="normalize_returns"):
        _mfpo(normalize_returns=True, estimator="reinforce")
    with pytest.raises(TypeError, match="normalize_returns"):
        MFPOUpdate(None, GAMMA, 2, 4, 8, lambda t: 0.1, lambda t, a: 0.5, normalize_returns=None)


# ---------------------------------------------------------------------------------------------
# fedrl reproduce mfpo --baseline ... --normalize-returns


def test_cli_runs_mfpo_with_the_critic_and_records_it(tmp_path):
    import json

    from fedrl_algos.cli import main

    code = main(["reproduce", "mfpo", "--env", "pendulum", "--quick", "--seeds", "2", "--no-sweeps", "--baseline", "critic",
                 "--normalize-returns", "--out", str(tmp_path), "--no-progress"])
    assert code == 0
    payload = json.loads((tmp_path / "mfpo" / "results.json").read_text())
    mfpo = payload["settings"]["mfpo_methods"]
    assert mfpo["mfpo_baseline"] == "critic" and mfpo["mfpo_normalize_returns"] is True
    assert payload["settings"]["methods"]["mfpo_baseline"] == "loo"  # FedAvg-PG and FedPG-BR keep theirs
    finals = [r["return"] for r in payload["records"] if r["method"] == "MFPO"]
    assert finals and all(abs(x) < float("inf") for x in finals)
    report = (tmp_path / "mfpo" / "report.md").read_text()
    assert "baseline='critic'" in report and "normalize_returns=True" in report


def test_train_mfpo_with_the_critic_equals_the_mfpo_class_per_seed():
    """The batched reproduction run with baseline='critic' is MFPOUpdate with every agent's critic seeded
    from its run's seed: two seeds batched equal each seed alone."""
    from fedrl_algos.reproduce.mfpo import MethodConfig, Population, train_mfpo

    cfg = MethodConfig(local_steps=2, n_trajectories=4, initial_trajectories=4, eval_trajectories=2, mfpo_baseline="critic",
                       mfpo_normalize_returns=True)
    both = train_mfpo(Population("cartpole", [0, 1], 3, cfg), 0.0, max_rounds=2)
    alone = [train_mfpo(Population("cartpole", [s], 3, cfg), 0.0, max_rounds=2) for s in (0, 1)]
    for k in range(len(both)):
        torch.testing.assert_close(both[k]["return"], torch.cat([a[k]["return"] for a in alone]), rtol=1e-5, atol=1e-4)


def test_train_mfpo_takes_the_gae_lambda_of_its_methods(monkeypatch):
    """``MethodConfig(mfpo_gae_lambda=λ)`` reaches MFPO's update (its advantages), changes the run, and
    needs the critic."""
    from fedrl_algos.mfpo import MFPOUpdate
    from fedrl_algos.reproduce.mfpo import MethodConfig, Population, train_mfpo

    seen = []
    original = MFPOUpdate.__init__

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("gae_lambda"))
        original(self, *args, **kwargs)

    monkeypatch.setattr(MFPOUpdate, "__init__", spy)
    cfg = MethodConfig(local_steps=2, n_trajectories=4, initial_trajectories=4, eval_trajectories=2, mfpo_baseline="critic")
    runs = {lam: train_mfpo(Population("cartpole", [0], 3, replace(cfg, mfpo_gae_lambda=lam)), 0.0, max_rounds=2) for lam in (1.0, 0.5)}
    assert seen == [1.0, 0.5]
    assert not torch.equal(runs[1.0][-1]["return"], runs[0.5][-1]["return"])
    with pytest.raises(ValueError, match="mfpo_gae_lambda"):
        MethodConfig(mfpo_gae_lambda=1.5, mfpo_baseline="critic")
    with pytest.raises(ValueError, match="needs mfpo_baseline='critic'"):
        MethodConfig(mfpo_gae_lambda=0.95)


def test_fedrl_reproduce_mfpo_takes_gae_lambda_for_mfpo_only(tmp_path, capsys):
    """``--gae-lambda`` sets MFPO's λ (FedAvg-PG and FedPG-BR have no critic), is recorded in the run's
    settings and report, and is refused out of [0, 1], without the critic and by other experiments."""
    import json

    from fedrl_algos.cli import main
    from fedrl_algos.reproduce.mfpo import MethodConfig, MFPOConfig

    code = main(["reproduce", "mfpo", "--env", "cartpole", "--quick", "--seeds", "2", "--no-sweeps", "--baseline", "critic",
                 "--gae-lambda", "0.9", "--out", str(tmp_path), "--no-progress"])
    assert code == 0
    settings = json.loads((tmp_path / "mfpo" / "results.json").read_text())["settings"]
    assert settings["mfpo_methods"]["mfpo_gae_lambda"] == 0.9
    assert settings["methods"]["mfpo_gae_lambda"] == 1.0
    assert "gae_lambda=0.9" in (tmp_path / "mfpo" / "report.md").read_text()
    assert MFPOConfig(baseline="critic", gae_lambda=0.9).mfpo_methods(MethodConfig()).mfpo_gae_lambda == 0.9
    for bad in ("1.5", "-0.1", "nan", "high"):
        with pytest.raises(SystemExit):
            main(["reproduce", "mfpo", "--quick", "--baseline", "critic", "--gae-lambda", bad])
        assert "--gae-lambda: must be a number in [0, 1]" in capsys.readouterr().err
    with pytest.raises(ValueError, match="gae_lambda=0.9 needs baseline='critic'"):
        MFPOConfig(gae_lambda=0.9)
    with pytest.raises(ValueError, match="gae_lambda must be a number in"):
        MFPOConfig(baseline="critic", gae_lambda=2)
    assert main(["reproduce", "byzantine", "--quick", "--gae-lambda", "0.9", "--no-progress"]) == 2
    assert "--gae-lambda" in capsys.readouterr().err
    # flags that clash are refused with the config's reason, not a traceback
    assert main(["reproduce", "mfpo", "--quick", "--gae-lambda", "0.9", "--no-progress"]) == 2
    assert "fedrl reproduce: gae_lambda=0.9 needs baseline='critic'" in capsys.readouterr().err
    assert main(["reproduce", "mfpo", "--quick", "--critic-time-aware", "--no-progress"]) == 2
    assert "critic_time_aware=True needs baseline='critic'" in capsys.readouterr().err


def test_bad_cli_and_config_values_are_refused(capsys):
    from fedrl_algos.cli import main
    from fedrl_algos.reproduce.mfpo import MethodConfig, MFPOConfig

    with pytest.raises(SystemExit):
        main(["reproduce", "mfpo", "--quick", "--baseline", "ridge"])
    assert "--baseline" in capsys.readouterr().err
    assert main(["reproduce", "byzantine", "--quick", "--baseline", "critic", "--no-progress"]) == 2
    assert "--baseline applies to mfpo" in capsys.readouterr().err
    with pytest.raises(ValueError, match="baseline"):
        MFPOConfig(baseline="ridge")
    with pytest.raises(TypeError, match="normalize_returns"):
        MFPOConfig(normalize_returns="yes")
    with pytest.raises(ValueError, match="mfpo_baseline"):
        MethodConfig(mfpo_baseline="ridge")
    assert MFPOConfig().mfpo_methods(MethodConfig()) == MethodConfig()  # the default is today's


# ---------------------------------------------------------------------------------------------
# FedAvgPG, IndependentPG and FedPGBR

GRID = "fedrl/GridWorld-v0"
FEDERATIONS = {
    "fedavg_pg": (FedAvgPG, {"step_size": 0.5, "local_steps": 2, "n_trajectories": 4}),
    "independent_pg": (IndependentPG, {"step_size": 0.5, "local_steps": 2, "n_trajectories": 4}),
    "fedpg_br": (FedPGBR, {"step_size": 0.5, "batch_range": (4, 6), "inner_batch_size": 2, "attack": "sign_flip",
                           "byzantine_agents": [0]}),
}


def _federation(name: str, **kwargs):
    cls, base = FEDERATIONS[name]
    return cls("TabularPolicy", GRID, **{**base, "seed": 3, "device": "cpu", "eval_trajectories": 0, **kwargs})


def _params(model) -> torch.Tensor:
    return model.agent_theta if isinstance(model, IndependentPG) else model.policy.theta.detach()


def _estimators(model) -> list:
    """Every estimator the model built (an attack's wrapper unwrapped)."""
    if isinstance(model, FedPGBR):
        update = model.update
        return [e for e in (update.estimator, update.agent_critic, update.server_critic) if e is not None]
    return [getattr(model.estimator, "inner", model.estimator)]


class _Swapped:
    """A model's estimator fed the same trajectories with their rewards swapped for
    :func:`normalized_return_rewards`: the hand computation of ``normalize_returns=True``."""

    def __init__(self, inner, gamma: float) -> None:
        self.inner, self.gamma = inner, gamma

    def __getattr__(self, name: str):
        return getattr(self.__dict__["inner"], name)

    def _swap(self, traj: Trajectories) -> Trajectories:
        return traj._replace(rewards=normalized_return_rewards(traj.rewards, traj.mask, self.gamma))

    def weights(self, traj: Trajectories) -> torch.Tensor:  # FedPG-BR: the agents' reports and the server's inner loop
        return self.inner.weights(self._swap(traj))

    def __call__(self, sampler, theta: torch.Tensor) -> torch.Tensor:  # FedAvg-PG, independent PG: every local step
        return self.inner(lambda th, m: self._swap(sampler(th, m)), theta)


@pytest.mark.parametrize("name", list(FEDERATIONS))
def test_federations_default_off_is_bitwise_todays_round(name):
    today, explicit = _federation(name), _federation(name, normalize_returns=False)
    assert explicit.normalize_returns is False
    assert not any(getattr(e, "normalize_returns", False) for e in _estimators(explicit))
    if name == "independent_pg":
        assert type(explicit.estimator) is PolicyGradient  # eq. (2), as before
    today.learn(total_rounds=2)
    explicit.learn(total_rounds=2)
    assert torch.equal(_params(today), _params(explicit))


@pytest.mark.parametrize("name,kwargs", [
    ("fedavg_pg", {}),
    ("fedavg_pg", {"baseline": None, "attack": "sign_flip", "byzantine_agents": [1]}),
    ("independent_pg", {}),
    ("independent_pg", {"baseline": "loo"}),
    ("fedpg_br", {}),
])
def test_federations_use_the_normalised_returns(name, kwargs):
    plain, normed, hand = _federation(name, **kwargs), _federation(name, normalize_returns=True, **kwargs), _federation(name, **kwargs)
    assert normed.normalize_returns is True and all(e.normalize_returns for e in _estimators(normed))
    if isinstance(hand, FedPGBR):
        hand.update.estimator = _Swapped(hand.update.estimator, hand.gamma)
    elif isinstance(hand, IndependentPG) and hand.baseline is None:
        # eq. (2) has no normalised form: with the option the estimate is GPOMDP without a baseline
        assert isinstance(normed.estimator, ScoreFunctionGradient) and normed.estimator.baseline is None
        hand.estimator = _Swapped(ScoreFunctionGradient(hand.policy, hand.gamma, hand.n_trajectories, "gpomdp", None), hand.gamma)
    elif hasattr(hand.estimator, "inner"):  # an attack's wrapper: the honest estimate inside it
        hand.estimator.inner = _Swapped(hand.estimator.inner, hand.gamma)
    else:
        hand.estimator = _Swapped(hand.estimator, hand.gamma)
    for model in (plain, normed, hand):
        model.learn(total_rounds=2)
    torch.testing.assert_close(_params(normed), _params(hand), rtol=1e-6, atol=1e-6)
    assert torch.isfinite(_params(normed)).all()
    assert not torch.allclose(_params(normed), _params(plain))


@pytest.mark.parametrize("name", list(FEDERATIONS))
def test_federations_refuse_bad_values(name):
    with pytest.raises(TypeError, match="normalize_returns"):
        _federation(name, normalize_returns=1)
    if name != "independent_pg":  # GPOMDP is its only estimator
        with pytest.raises(ValueError, match="normalize_returns"):
            _federation(name, estimator="reinforce", normalize_returns=True)


def test_estimators_refuse_bad_values():
    policy = TabularPolicy(Discrete(4), Discrete(2))
    with pytest.raises(TypeError, match="normalize_returns"):
        CriticGradient(policy, GAMMA, 4, None, normalize_returns="yes")
    with pytest.raises(ValueError, match="normalize_returns"):
        FedPGBRUpdate(policy, GAMMA, (4, 6), 2, 0.5, "auto", 0.6, 0.4, estimator="reinforce", normalize_returns=True)
    with pytest.raises(TypeError, match="normalize_returns"):
        FedPGBRUpdate(policy, GAMMA, (4, 6), 2, 0.5, "auto", 0.6, 0.4, normalize_returns=None)


@pytest.mark.parametrize("name", list(FEDERATIONS))
def test_federations_save_load_and_older_files(tmp_path, name):
    cls = FEDERATIONS[name][0]
    model = _federation(name, normalize_returns=True)
    model.learn(total_rounds=1)
    model.save(tmp_path / "m.zip")
    loaded = cls.load(tmp_path / "m.zip", device="cpu")
    assert loaded.normalize_returns is True and all(e.normalize_returns for e in _estimators(loaded))
    model.learn(total_rounds=1, reset_num_timesteps=False)
    loaded.learn(total_rounds=1, reset_num_timesteps=False)
    assert torch.equal(_params(model), _params(loaded))
    old = _federation(name)
    del old.__dict__["normalize_returns"]  # a file saved before the option existed
    old.save(tmp_path / "old.zip")
    loaded_old = cls.load(tmp_path / "old.zip", device="cpu")
    assert loaded_old.normalize_returns is False
    assert not any(getattr(e, "normalize_returns", False) for e in _estimators(loaded_old))
    if name == "independent_pg":
        assert type(loaded_old.estimator) is PolicyGradient


def test_every_critic_of_the_federations_gets_it():
    assert _federation("independent_pg", baseline="critic", critic_net_arch=[8], normalize_returns=True).estimator.normalize_returns
    update = _federation("fedpg_br", baseline="critic", critic_net_arch=[8], normalize_returns=True).update
    assert update.agent_critic.normalize_returns and update.server_critic.normalize_returns


def test_fedavg_pg_critic_weights_and_targets_are_the_normalised_returns():
    """λ = 1 and the initial critic (V = 0): the step weights are ``γ^h Ĝ^h`` and the regression targets ``Ĝ^h``;
    after a round every agent's critic was fitted on normalised targets (their mean over a batch is 0)."""
    model = _federation("fedavg_pg", baseline="critic", critic_net_arch=[8], normalize_returns=True)
    gradient = model.estimator
    assert isinstance(gradient, CriticGradient) and gradient.normalize_returns and gradient.gae_lambda == 1.0
    gradient.state = model.critic_state
    theta = model.policy.theta.detach().expand(1, model.n_agents, -1)
    traj = model.federation.sampler(theta, 6)
    psi, targets = gradient.step_weights(traj)
    g_hat = normalize_episode_returns(relative_rewards_to_go(traj.rewards * traj.mask, model.gamma), traj.mask)
    assert g_hat.abs().sum() > 0
    discount = model.gamma ** torch.arange(traj.rewards.shape[-1], dtype=g_hat.dtype)
    torch.testing.assert_close(targets, g_hat, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(psi, g_hat * discount, rtol=1e-5, atol=1e-5)
    fresh = _federation("fedavg_pg", baseline="critic", critic_net_arch=[8], normalize_returns=True)
    plain = _federation("fedavg_pg", baseline="critic", critic_net_arch=[8])
    fresh.learn(total_rounds=1)
    plain.learn(total_rounds=1)
    torch.testing.assert_close(fresh.agent_critic_mean, torch.zeros_like(fresh.agent_critic_mean), rtol=0, atol=1e-5)
    assert plain.agent_critic_mean.abs().max() > 0.1  # raw returns-to-go
