"""fedrl on Flower: the agent and server halves of every algorithm, Flower's simulation engine
(Ray) and a real deployment on loopback.

* The halves, without Flower: one round assembled from :class:`AgentWorker` replies equals the
  in-process round bit for bit, for every algorithm; bad replies are rejected and leave the model
  as if the agent had not taken part.
* Simulation: ``simulate(model, n)`` equals ``model.learn(total_rounds=n)`` bit for bit on CPU
  (Per-FedAvg-PG, MFPO with its momentum state across rounds, FedPG-BR with its filter decisions);
  clients that raise, time out, or reply with NaN or wrong shapes are rejected and the round goes on;
  too few valid replies skip the round; a killed ServerApp resumes from its checkpoint and ends
  equal to an uninterrupted run.
* Deployment: a SuperLink and 4 SuperNodes as processes, TLS and SuperNode authentication, 2 rounds
  equal to the in-process run; an unregistered SuperNode is refused.
"""

from __future__ import annotations

import copy
import time

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")
pytest.importorskip("ray")

from flwr.app import Array, ArrayRecord, Message, RecordDict  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402

from fedrl_algos import MFPO, FedAvgPG, FedPGBR, IndependentPG, PerFedAvgPG  # noqa: E402
from fedrl_algos.core.aggregation import RejectedUpdateWarning  # noqa: E402
from fedrl_algos.flower import AgentWorker, RoundReplies, protocol_for, simulate  # noqa: E402
from fedrl_algos.flower.app_dir import write_app  # noqa: E402
from fedrl_algos.flower.local import LocalDeployment  # noqa: E402

GRID = "fedrl/GridWorld-v0"


def _models():
    return {
        "per_fedavg_pg": lambda: PerFedAvgPG("TabularPolicy", GRID, seed=0, device="cpu", local_steps=2),
        "per_fedavg_pg_sampled": lambda: PerFedAvgPG("TabularPolicy", GRID, seed=5, device="cpu", local_steps=2, agents_per_round=3),
        "fedavg_pg_sampled": lambda: FedAvgPG("TabularPolicy", GRID, seed=6, device="cpu", agents_per_round=2),
        "fedavg_pg": lambda: FedAvgPG("TabularPolicy", GRID, seed=3, device="cpu"),
        "fedavg_pg_adam": lambda: FedAvgPG("TabularPolicy", GRID, seed=3, device="cpu", server_optimizer="adam"),
        "independent_pg": lambda: IndependentPG("TabularPolicy", GRID, seed=4, device="cpu"),
        "mfpo": lambda: MFPO("TabularPolicy", GRID, seed=1, device="cpu", local_steps=3, n_trajectories=4, initial_trajectories=8),
        # Adam steps: the agents' moments travel with the messages
        "mfpo_adam": lambda: MFPO("TabularPolicy", GRID, seed=1, device="cpu", local_steps=3, n_trajectories=4, initial_trajectories=8,
                                  optimizer="adam", step_size=0.05, momentum=0.5),
        "fedpg_br": lambda: FedPGBR("TabularPolicy", GRID, seed=2, device="cpu", byzantine_agents=[3, 5], attack="sign_flip"),
        # the cross-fitted linear baseline is stateless: nothing more travels with the messages
        "mfpo_linear": lambda: MFPO("TabularPolicy", GRID, seed=1, device="cpu", local_steps=3, n_trajectories=6, initial_trajectories=8,
                                    baseline="linear"),
        "fedpg_br_linear": lambda: FedPGBR("TabularPolicy", GRID, seed=2, device="cpu", baseline="linear"),
        "independent_pg_linear": lambda: IndependentPG("TabularPolicy", GRID, seed=4, device="cpu", baseline="linear"),
        "per_fedavg_pg_linear": lambda: PerFedAvgPG("TabularPolicy", GRID, seed=0, device="cpu", local_steps=2,
                                                    adaptation_baseline="linear", outer_baseline="linear"),
        # a Gymnasium id (not a fedrl family): each agent's environments are rebuilt on its client
        # and their random state travels with the messages
        # (horizon 8: every episode runs its 9 steps, so a client's batch has the in-process length;
        # trimmed batches of other lengths: test_halves_on_trimmed_batches_equal_the_in_process_round_to_rounding)
        "mfpo_gymnasium": lambda: MFPO("MlpPolicy", "CartPole-v1", n_agents=3, seed=1, device="cpu", local_steps=2,
                                       n_trajectories=3, initial_trajectories=4, horizon=8, eval_trajectories=0),
    }


def _params(model) -> torch.Tensor:
    return model.agent_theta if isinstance(model, IndependentPG) else model.theta


def _round_by_halves(server, workers, faults=None, min_replies=1):
    """One round assembled from the protocol's halves, as a Strategy does it (no Flower); the
    protocol lives as long as the server model, as a Strategy's does for a run."""
    protocol = server.__dict__.setdefault("_test_protocol", protocol_for(server))
    asked = protocol.participants()
    got, failures = {}, {}
    for agent in asked:
        arrays, config = protocol.train_message(agent)
        reply = protocol.agent_round(workers[agent], arrays, config, workers[agent].state)
        protocol.store_counters(agent, reply.arrays.pop("stream-counters"))
        if "env-state" in reply.arrays:
            protocol.store_env_state(agent, reply.arrays.pop("env-state"))
        fault = (faults or {}).get(agent)
        if fault == "raise":
            failures[agent] = "client error: boom"
            continue
        if fault == "nan":
            reply.arrays = {k: np.full_like(v, np.nan) for k, v in reply.arrays.items()}
        if fault == "shape":
            reply.arrays = {k: v[:-1] for k, v in reply.arrays.items()}
        if fault == "nan-critic":
            reply.arrays["critic-phi"] = np.full_like(reply.arrays["critic-phi"], np.nan)
        got[agent] = reply
    return protocol.server_update(RoundReplies(asked, got, failures), min_replies)


def _workers(model):
    workers = {}
    for agent in range(model.n_agents):
        worker = AgentWorker(copy.deepcopy(model), agent)
        worker.state = {}
        workers[agent] = worker
    return workers


def _in_process_and_by_halves(make, rounds: int = 3):
    """The same model trained ``rounds`` rounds in process and by the protocol's halves."""
    reference, server = make(), make()
    workers = _workers(server)
    reference.learn(total_rounds=rounds)
    for _ in range(rounds):
        server._round_rejected, server._round_skipped = 0, 0
        _round_by_halves(server, workers)
        server.rounds_done += 1
    return reference, server


def test_halves_on_trimmed_batches_equal_the_in_process_round_to_rounding():
    """Episodes that end early: a client trims its agent's batch to that agent's longest episode, the
    in-process round to the federation's longest, so the same steps are summed beside different
    lengths of masked padding: equal up to floating-point rounding, not bitwise."""
    def make():
        return MFPO("MlpPolicy", "CartPole-v1", n_agents=3, seed=1, device="cpu", local_steps=2, n_trajectories=3,
                    initial_trajectories=4, horizon=40, eval_trajectories=0)

    reference, server = _in_process_and_by_halves(make)
    # the first batch: the agents' longest episodes differ, so a client's is shorter than the in-process one
    fresh = make()
    longest = fresh.federation.sampler(fresh.policy.theta.detach().expand(1, 3, -1).clone(), 4).mask.sum(-1).amax(-1)
    assert len(set(longest.flatten().tolist())) > 1
    torch.testing.assert_close(server.theta, reference.theta, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("name", list(_models()))
def test_halves_equal_the_in_process_round(name):
    make = _models()[name]
    reference, server = _in_process_and_by_halves(make)
    assert torch.equal(_params(reference), _params(server))
    if name.startswith("mfpo"):
        assert torch.equal(reference.agent_direction, server.agent_direction)
        assert torch.equal(reference.agent_theta_prev, server.agent_theta_prev)
    if name == "mfpo_adam":
        for moment in ("agent_adam_step", "agent_adam_first", "agent_adam_second"):
            assert torch.equal(getattr(reference, moment), getattr(server, moment)), moment
    if name == "fedpg_br":
        assert reference.filter_history == server.filter_history


# baseline="critic": every agent's critic travels with its messages (small batches, 2 fits per batch)
_CRITIC = {
    "fedavg_pg": lambda agg: FedAvgPG("TabularPolicy", GRID, seed=3, device="cpu", n_trajectories=4, baseline="critic",
                                      n_critic_epochs=2, critic_aggregation=agg),
    "fedavg_pg_sampled": lambda agg: FedAvgPG("TabularPolicy", GRID, seed=6, device="cpu", n_trajectories=4, agents_per_round=3,
                                              baseline="critic", n_critic_epochs=2, critic_aggregation=agg),
    "independent_pg": lambda agg: IndependentPG("TabularPolicy", GRID, seed=4, device="cpu", n_trajectories=4, baseline="critic",
                                                n_critic_epochs=2, critic_aggregation=agg),
    "fedpg_br": lambda agg: FedPGBR("TabularPolicy", GRID, seed=2, device="cpu", batch_range=(3, 5), byzantine_agents=[3],
                                    attack="sign_flip", baseline="critic", n_critic_epochs=2, critic_aggregation=agg),
    "mfpo": lambda agg: MFPO("TabularPolicy", GRID, seed=1, device="cpu", local_steps=2, n_trajectories=3, initial_trajectories=4,
                             baseline="critic", n_critic_epochs=2, critic_aggregation=agg),
    "per_fedavg_pg": lambda agg: PerFedAvgPG("TabularPolicy", GRID, seed=5, device="cpu", local_steps=2, m_in=3, m_h=3, m_out=3,
                                             adaptation_baseline="critic", outer_baseline="critic", n_critic_epochs=2,
                                             critic_aggregation=agg),
    "per_fedavg_pg_sampled": lambda agg: PerFedAvgPG("TabularPolicy", GRID, seed=7, device="cpu", local_steps=2, m_in=3, m_h=3,
                                                     m_out=3, agents_per_round=3, adaptation_baseline="critic",
                                                     outer_baseline="loo", n_critic_epochs=2, critic_aggregation=agg),
    # image observations: the Nature-CNN critic (tests/test_cnn_critic.py's test-only env)
    "mfpo_cnn": lambda agg: _cnn_critic_mfpo(agg),
}


def _cnn_critic_mfpo(aggregation):
    from test_cnn_critic import IMAGE_ENV  # registers the test-only image env

    return MFPO("CnnPolicy", IMAGE_ENV, agent_kwargs=[{"speed": 2}, {"speed": 3}], seed=1, device="cpu", local_steps=2,
                n_trajectories=2, initial_trajectories=3, baseline="critic", n_critic_epochs=2, critic_net_arch=[16],
                critic_aggregation=aggregation, policy_kwargs=dict(features_dim=16), eval_trajectories=0)
_CRITIC_CASES = [(name, agg) for name in _CRITIC for agg in (("local",) if name == "independent_pg" else ("local", "average"))]


def _critic_fields(model) -> dict[str, torch.Tensor]:
    from fedrl_algos.common.agent_critic import critic_fields

    return {f: getattr(model, f) for owner in type(model).critic_owners for f in critic_fields(owner)}


def _assert_same_critics(a, b):
    one, two = _critic_fields(a), _critic_fields(b)
    assert one.keys() == two.keys()
    for name in one:
        assert torch.equal(one[name], two[name]), name


@pytest.mark.parametrize("name,aggregation", _CRITIC_CASES)
def test_critics_travel_and_halves_equal_learn(name, aggregation):
    """With ``baseline="critic"`` the messages carry the agent's critic (φ, Adam state, μ, σ) both ways;
    two rounds by halves equal two in-process rounds bit for bit in θ and in every critic field
    (FedPG-BR's server critic, which stays on the server, included)."""
    make = _CRITIC[name]
    reference, server = make(aggregation), make(aggregation)
    workers = _workers(server)
    protocol = protocol_for(server)
    arrays, _ = protocol.train_message(0)  # (participants() would draw this round's sample)
    assert {"critic-phi", "critic-adam-step", "critic-adam-first", "critic-adam-second", "critic-mean", "critic-scale"} <= set(arrays)
    reference.learn(total_rounds=2)
    for _ in range(2):
        server._round_rejected, server._round_skipped = 0, 0
        _round_by_halves(server, workers)
        server.rounds_done += 1
    assert torch.equal(_params(reference), _params(server))
    _assert_same_critics(reference, server)
    assert not torch.equal(server.agent_critic_phi, make(aggregation).agent_critic_phi)  # the critics were fitted


def test_unsampled_agents_keep_their_critics():
    server = _CRITIC["fedavg_pg_sampled"]("local")
    start = server.agent_critic_phi.clone()
    _round_by_halves(server, _workers(server))
    mask = server.__dict__["_test_protocol"]._mask[0] > 0
    assert int(mask.sum()) == 3
    assert torch.equal(server.agent_critic_phi[~mask], start[~mask])
    assert not torch.equal(server.agent_critic_phi[mask], start[mask])


@pytest.mark.parametrize("name,aggregation", [("fedavg_pg", "average"), ("mfpo", "local"), ("fedpg_br", "average")])
def test_a_bad_critic_rejects_the_reply(name, aggregation):
    """A reply whose critic is not finite is rejected: θ and every critic end as if that agent had failed."""
    make = _CRITIC[name]
    bad, failed = make(aggregation), make(aggregation)
    with pytest.warns(RejectedUpdateWarning, match="agent 2: critic-phi is not finite"):
        _round_by_halves(bad, _workers(bad), {2: "nan-critic"})
    with pytest.warns(RejectedUpdateWarning):
        _round_by_halves(failed, _workers(failed), {2: "raise"})
    assert torch.equal(bad.theta, failed.theta) and bool(torch.isfinite(bad.theta).all())
    _assert_same_critics(bad, failed)
    assert bool(torch.isfinite(bad.agent_critic_phi).all())
    if aggregation == "local":  # the failed agent keeps its critic of the round's start
        assert torch.equal(bad.agent_critic_phi[2], make(aggregation).agent_critic_phi[2])


_NORMALIZED = {
    "fedavg_pg": lambda **kw: FedAvgPG("TabularPolicy", GRID, seed=3, device="cpu", local_steps=2, n_trajectories=10, **kw),
    "independent_pg": lambda **kw: IndependentPG("TabularPolicy", GRID, seed=4, device="cpu", n_trajectories=10, **kw),
    "fedpg_br": lambda **kw: FedPGBR("TabularPolicy", GRID, seed=2, device="cpu", byzantine_agents=[3, 5], attack="sign_flip", **kw),
    "mfpo": lambda **kw: MFPO("TabularPolicy", GRID, seed=1, device="cpu", local_steps=3, n_trajectories=4, initial_trajectories=8, **kw),
}


@pytest.mark.parametrize("name", list(_NORMALIZED))
def test_normalize_returns_travels_in_the_model_file(name):
    """A ClientApp loads the model from its file (``flower.task.load_model``) and rebuilds its estimator
    from the saved attributes: ``normalize_returns=True`` reaches the agents with nothing in the messages,
    and two rounds by halves equal the in-process rounds."""
    from fedrl_algos.flower.task import load_model, model_to_bytes

    make = _NORMALIZED[name]
    reference, server, plain = make(normalize_returns=True), make(normalize_returns=True), make()
    data = model_to_bytes(server)
    workers = {}
    for agent in range(server.n_agents):
        workers[agent] = AgentWorker(load_model(data), agent)
        workers[agent].state = {}
        assert workers[agent].model.normalize_returns is True
    reference.learn(total_rounds=2)
    plain.learn(total_rounds=2)
    for _ in range(2):
        server._round_rejected, server._round_skipped = 0, 0
        _round_by_halves(server, workers)
        server.rounds_done += 1
    assert torch.equal(_params(reference), _params(server))
    assert not torch.equal(_params(plain), _params(server))


@pytest.mark.parametrize("name", ["per_fedavg_pg", "mfpo", "mfpo_adam", "fedpg_br"])
def test_bad_replies_are_rejected_and_the_round_uses_the_others(name):
    make = _models()[name]
    faulty, server = make(), make()
    faults = {1: "raise", 2: "nan", 4: "shape"}
    with pytest.warns(RejectedUpdateWarning) as caught:
        _round_by_halves(faulty, _workers(faulty), faults)
    text = " ".join(str(w.message) for w in caught)
    for agent, word in ((1, "boom"), (2, "not finite"), (4, "shape")):
        assert f"agent {agent}" in text and word in text
    # The same round where the three agents are absent and marked invalid from the start.
    protocol = protocol_for(server)
    workers = _workers(server)
    asked = protocol.participants()
    got = {}
    for agent in asked:
        arrays, config = protocol.train_message(agent)
        reply = protocol.agent_round(workers[agent], arrays, config, {})
        protocol.store_counters(agent, reply.arrays.pop("stream-counters"))
        if agent not in faults:
            got[agent] = reply
    with pytest.warns(RejectedUpdateWarning):
        protocol.server_update(RoundReplies(asked, got, {a: "absent" for a in faults}), 1)
    assert torch.equal(faulty.theta, server.theta)
    assert bool(torch.isfinite(faulty.theta).all())


def test_too_few_valid_replies_skip_the_round():
    model = _models()["per_fedavg_pg"]()
    before = model.theta
    with pytest.warns(RejectedUpdateWarning, match="round skipped"):
        outcome = _round_by_halves(model, _workers(model), {a: "raise" for a in range(1, model.n_agents)}, min_replies=2)
    assert outcome["skipped"]
    assert torch.equal(model.theta, before)


def test_mfpo_agent_keeps_its_previous_parameters_between_rounds():
    server = _models()["mfpo"]()
    workers = _workers(server)
    protocol = protocol_for(server)
    _round_by_halves(server, workers)
    server.rounds_done += 1
    arrays, _ = protocol.train_message(0)
    assert "theta-prev" not in arrays  # the agent holds its own θ^(t-1) now
    assert np.array_equal(workers[0].state["mfpo-theta-prev"], server.agent_theta_prev[0].numpy())
    lost = AgentWorker(copy.deepcopy(server), 0)
    arrays, config = protocol.train_message(0)
    with pytest.raises(ValueError, match="state lost"):
        protocol.agent_round(lost, arrays, config, {})


def test_unsupported_federations_are_refused():
    from stable_baselines3 import PPO

    from fedrl_algos import FedAvgSB3

    with pytest.raises(TypeError, match="FedAvgSB3 declares no round_protocol"):
        protocol_for(FedAvgSB3(PPO, "CartPole-v1", n_agents=2, seed=0, device="cpu"))
    colluding = FedPGBR("TabularPolicy", GRID, seed=0, device="cpu", byzantine_agents=[1], attack="fedscspg")
    with pytest.raises(ValueError, match="pools"):
        protocol_for(colluding).train_message(0)
    sampled = PerFedAvgPG("MlpPolicy", "CartPole-v1", n_agents=3, seed=0, device="cpu", horizon=20, agents_per_round=2)
    with pytest.raises(ValueError, match="agents_per_round with a Gymnasium-env federation"):
        protocol_for(sampled)
    normalized = PerFedAvgPG("MlpPolicy", "CartPole-v1", n_agents=2, seed=0, device="cpu", horizon=20, normalize_observations=True)
    with pytest.raises(ValueError, match="normalize_observations"):
        AgentWorker(normalized, 0)
    with pytest.raises(ValueError, match="num_supernodes"):
        simulate(_models()["per_fedavg_pg"](), 1, num_supernodes=3)
    with pytest.raises(ValueError, match="agent must be"):
        AgentWorker(_models()["per_fedavg_pg"](), 8)


def test_app_directory_is_a_valid_flower_app(tmp_path):
    from flwr.common.config import get_fab_config, validate_config  # noqa: F401

    model = _models()["per_fedavg_pg"]()
    model.save(tmp_path / "model.zip")
    app = write_app(tmp_path / "app", tmp_path / "model.zip", num_rounds=3)
    import tomli

    config = tomli.loads((app / "pyproject.toml").read_text())
    ok, errors, _ = validate_config(config, check_module=False, project_dir=app)
    assert ok, errors
    assert config["tool"]["flwr"]["app"]["config"]["num-rounds"] == 3
    with pytest.raises(FileNotFoundError, match="model_path"):
        write_app(tmp_path / "app2", tmp_path / "missing.zip")


# --- Flower's simulation engine -----------------------------------------------------------------


@pytest.mark.parametrize("name,rounds", [("per_fedavg_pg", 5), ("mfpo", 3), ("fedpg_br", 3), ("mfpo_gymnasium", 2), ("mfpo_linear", 2),
                                         ("mfpo_critic", 2)])
def test_simulation_equals_learn(name, rounds):
    make = (lambda: _CRITIC["mfpo"]("average")) if name == "mfpo_critic" else _models()[name]
    reference = make().learn(total_rounds=rounds)
    trained = simulate(make(), num_rounds=rounds)
    assert torch.equal(reference.theta, trained.theta)
    assert trained.rounds_done == reference.rounds_done == rounds
    assert trained.num_timesteps == reference.num_timesteps
    if name == "mfpo":
        assert torch.equal(reference.agent_theta_prev, trained.agent_theta_prev)
    if name == "fedpg_br":
        assert reference.filter_history == trained.filter_history
    if name == "mfpo_critic":
        _assert_same_critics(reference, trained)


class _Rounds(BaseCallback):
    """Records what the server saw each round."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, int, torch.Tensor]] = []

    def _on_step(self) -> bool:
        self.seen.append((self.model._round_rejected, self.model._round_skipped, self.model.theta))
        return True


#: the round timeout of the faulty-clients test: long enough for the honest clients to reply on a
#: loaded 2-core machine (4 s timed them out there), short enough to keep the test fast
SLOW_CLIENT_TIMEOUT = 10.0


def _fault_mod(plan):
    """A Flower client mod: in round r, agent a does plan[(r, a)] instead of replying honestly."""

    def mod(msg, context, call_next):
        if msg.metadata.message_type != "train":
            return call_next(msg, context)
        fault = plan.get((int(msg.content["config"]["server-round"]), int(context.node_config["partition-id"])))
        if fault == "raise":
            raise RuntimeError("injected client failure")
        if fault == "sleep":  # past the round's timeout (SLOW_CLIENT_TIMEOUT) by a margin
            time.sleep(SLOW_CLIENT_TIMEOUT + 4.0)
        reply = call_next(msg, context)
        if fault in ("nan", "shape"):
            arrays = {k: v.numpy() for k, v in reply.content["arrays"].items()}
            arrays["theta"] = np.full_like(arrays["theta"], np.nan) if fault == "nan" else arrays["theta"][:-1]
            content = RecordDict({"arrays": ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()}),
                                  "metrics": reply.content["metrics"]})
            reply = Message(content, reply_to=msg)
        return reply

    return mod


def test_simulation_survives_faulty_clients():
    make = _models()["per_fedavg_pg"]
    plan = {(1, 1): "raise", (1, 2): "nan", (1, 3): "shape", (1, 4): "sleep"}
    plan.update({(2, a): "raise" for a in range(1, 8)})
    rounds = _Rounds()
    trained = simulate(make(), num_rounds=2, round_timeout=SLOW_CLIENT_TIMEOUT, min_train_nodes=2, callback=rounds, client_mods=[_fault_mod(plan)])
    (rejected_1, skipped_1, theta_1), (rejected_2, skipped_2, theta_2) = rounds.seen
    assert (rejected_1, skipped_1) == (4, 0)
    assert skipped_2 == 1
    assert torch.equal(theta_2, theta_1) and torch.equal(trained.theta, theta_1)
    # Round 1 equals the round of the halves with agents 1-4 failing.
    reference = make()
    with pytest.warns(RejectedUpdateWarning):
        _round_by_halves(reference, _workers(reference), {1: "raise", 2: "nan", 3: "shape", 4: "raise"})
    assert torch.equal(theta_1, reference.theta)


class _Crash(BaseCallback):
    def __init__(self, after: int) -> None:
        super().__init__()
        self.after = after

    def _on_step(self) -> bool:
        if self.model.rounds_done >= self.after:
            raise RuntimeError("server killed")
        return True


@pytest.mark.parametrize("name", ["mfpo"])
def test_restarted_server_resumes_from_its_checkpoint(name, tmp_path):
    make = _models()[name]
    checkpoint = tmp_path / "server.zip"
    with pytest.raises(RuntimeError, match="server killed"):
        simulate(make(), num_rounds=4, checkpoint_path=checkpoint, callback=_Crash(2))
    assert checkpoint.is_file()
    resumed = simulate(make(), num_rounds=4, checkpoint_path=checkpoint)
    reference = make().learn(total_rounds=4)
    assert resumed.rounds_done == 4
    assert torch.equal(resumed.theta, reference.theta)
    assert torch.equal(resumed.agent_theta_prev, reference.agent_theta_prev)


# --- deployment: real processes on loopback -----------------------------------------------------


def test_deployment_matches_learn_and_refuses_unregistered_supernodes(tmp_path):
    agents = [{"goal": (0, 0)}, {"goal": (4, 4)}, {"goal": (0, 4)}, {"goal": (4, 0)}]

    def make():
        return PerFedAvgPG("TabularPolicy", GRID, seed=0, device="cpu", local_steps=2, agent_kwargs=agents)

    make().save(tmp_path / "model.zip")
    app = write_app(tmp_path / "app", tmp_path / "model.zip", num_rounds=2, output_path=tmp_path / "trained.zip", node_timeout=60)
    with LocalDeployment(tmp_path / "deployment", n_supernodes=4, secure=True, unregistered_supernodes=1) as deployment:
        done = deployment.run(app, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        intruder = deployment.processes["unregistered-0"]
        deadline = time.monotonic() + 30
        while intruder.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert intruder.poll() not in (None, 0)
        assert "Failed to activate SuperNode" in deployment.log("unregistered-0")
    trained = PerFedAvgPG.load(tmp_path / "trained.zip", device="cpu")
    reference = make().learn(total_rounds=2)
    assert trained.rounds_done == 2
    assert torch.equal(trained.theta, reference.theta)


# --- Flower's robust strategies in place of FedPG-BR's filter -----------------------------------


def test_flower_aggregators_apply_flowers_rules():
    from fedrl_algos.flower.robust import flower_aggregator

    honest = torch.tensor([[1.0, 0.0], [1.1, 0.1], [0.9, -0.1], [1.0, 0.05]], dtype=torch.float64)
    grads = torch.cat([honest, torch.tensor([[-50.0, 40.0]], dtype=torch.float64)]).unsqueeze(0)  # [1, 5, 2]
    usable = torch.ones(1, 5, dtype=torch.bool)
    mu, kept = flower_aggregator("krum", num_malicious_nodes=1)(grads, usable)
    assert int(kept.sum()) == 1 and not bool(kept[0, 4])
    mu, kept = flower_aggregator("multikrum", num_malicious_nodes=1)(grads, usable)
    assert kept[0].tolist() == [True, True, True, True, False]
    assert torch.allclose(mu[0], honest.mean(0))
    mu, _ = flower_aggregator("fedmedian")(grads, usable)
    assert torch.equal(mu[0], torch.as_tensor(np.median(grads[0].numpy(), axis=0)))
    unusable = usable.clone()
    unusable[0, 0] = False
    _, kept = flower_aggregator("fedtrimmedavg", beta=0.2)(grads, unusable)
    assert kept[0].tolist() == [False, True, True, True, True]
    with pytest.raises(ValueError, match="name must be one of"):
        flower_aggregator("bulyan")


def test_robust_comparison_runs_through_the_flower_round():
    from fedrl_algos.flower.robust import comparison_table, gridworld_comparison

    records = gridworld_comparison(attacks=("sign_flip",), aggregators=("fedpg_br", "multikrum"), seeds=(0,), rounds=3)
    assert [(r["attack"], r["aggregator"]) for r in records] == [("sign_flip", "fedpg_br"), ("sign_flip", "multikrum")]
    assert all(0.0 < r["score"] < 10.0 for r in records)
    assert "| sign_flip |" in comparison_table(records)
    # The filter's run is the plain FedPG-BR federation's in-process result.
    reference = FedPGBR("TabularPolicy", GRID, step_size=0.5, batch_range=(4, 6), seed=0, device="cpu",
                        byzantine_agents=[5, 6, 7], attack="sign_flip").learn(total_rounds=3)
    assert records[0]["score"] == pytest.approx(float(reference.evaluator.returns(reference.theta.to(torch.float64)).mean()), abs=0)


def test_cli_app_writes_a_runnable_app(tmp_path, capsys):
    from fedrl_algos.cli import main

    assert main(["flower", "app", str(tmp_path / "app"), "--algo", "per_fedavg_pg", "--model", str(tmp_path / "m.zip"), "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    assert "flower-superlink" in out and "partition-id=7" in out
    assert (tmp_path / "app" / "pyproject.toml").is_file() and (tmp_path / "m.zip").is_file()


def test_fraction_train_is_the_models_agents_per_round():
    from fedrl_algos.flower.server_app import _apply_fraction_train

    model = _models()["per_fedavg_pg"]()
    _apply_fraction_train(model, 0.25, 3)
    assert model.agents_per_round == 3  # max(int(0.25 · 8), min_train_nodes)
    _apply_fraction_train(model, 1.0, None)
    assert model.agents_per_round is None
    for bad in (0.0, 1.5, True, "half"):
        with pytest.raises(ValueError, match="fraction_train"):
            _apply_fraction_train(model, bad, None)
    with pytest.raises(ValueError, match="client sampling"):
        _apply_fraction_train(_models()["mfpo"](), 0.5, None)


def test_flower_fails_loudly():
    # An option the clients refuse fails in the driver, before Ray starts, with its reason ...
    normalized = PerFedAvgPG("MlpPolicy", "CartPole-v1", n_agents=2, seed=0, device="cpu", horizon=20, normalize_observations=True)
    with pytest.raises(ValueError, match="normalize_observations"):
        simulate(normalized, num_rounds=1)
    # ... and a federation whose every round is skipped raises, naming the first reason, instead of
    # returning an untrained model.
    plan = {(r, a): "raise" for r in (1, 2) for a in range(8)}
    with pytest.warns(RejectedUpdateWarning), pytest.raises(RuntimeError, match="every one of the 2 Flower rounds was skipped.*injected"):
        simulate(_models()["per_fedavg_pg"](), num_rounds=2, client_mods=[_fault_mod(plan)])


_USER_ENV_MODULE = '''
import gymnasium as gym
import numpy as np


class Drift(gym.Env):
    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, drift=0.0):
        self.drift, self.x = drift, 0.0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = float(self.np_random.uniform(-1, 1))
        return np.array([self.x], np.float32), {}

    def step(self, action):
        self.x += (int(action) - 0.5) * 0.2 + self.drift
        return np.array([self.x], np.float32), -abs(self.x), abs(self.x) > 3, False, {}


gym.register("fedrl_user/Drift-v0", entry_point=Drift, max_episode_steps=12)
'''


def test_a_users_own_env_reaches_the_clientapps_through_env_modules(tmp_path, monkeypatch):
    # Registered by a module of the user's: the ClientApps (other processes) import it when told to.
    (tmp_path / "fedrl_user_envs.py").write_text(_USER_ENV_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import fedrl_user_envs  # noqa: F401  (the user's script registers its env)

    def make():
        return IndependentPG("MlpPolicy", "fedrl_user/Drift-v0", agent_kwargs=[{"drift": 0.0}, {"drift": 0.05}], n_trajectories=3,
                             seed=0, device="cpu", eval_trajectories=0)

    reference = make().learn(total_rounds=2)
    with pytest.warns(RejectedUpdateWarning), pytest.raises(RuntimeError, match="not a registered Gymnasium environment"):
        simulate(make(), num_rounds=1)  # without env_modules: every client fails, and the run says why
    trained = simulate(make(), num_rounds=2, env_modules=["fedrl_user_envs"])
    assert trained.rounds_done == 2
    # Trained on the clients: one round step for step as in one process (float sums may be
    # reordered by the thread counts of the two processes, so to float32 rounding).
    torch.testing.assert_close(trained.agent_theta, reference.agent_theta, rtol=1e-5, atol=1e-6)
    assert not torch.equal(trained.agent_theta, make().agent_theta)


def test_the_docs_deployment_example_runs_as_written(tmp_path, monkeypatch):
    # docs/flower.md's own text, run in a fresh directory with its relative paths.
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "flower.md").read_text()
    (code,) = re.findall(r"```python\n(from fedrl_algos\.flower\.app_dir import write_app\n.*?)```", text, flags=re.DOTALL)
    monkeypatch.chdir(tmp_path)

    def make():
        return PerFedAvgPG("TabularPolicy", GRID, seed=0, device="cpu", local_steps=1, agent_kwargs=[{"goal": (0, 0)}, {"goal": (4, 4)}])

    exec(compile(code, "docs/flower.md", "exec"), {"model": make()})  # noqa: S102  (the page's example)
    trained = PerFedAvgPG.load(tmp_path / "trained.zip", device="cpu")
    assert trained.rounds_done == 2 and torch.equal(trained.theta, make().learn(total_rounds=2).theta)
    assert (tmp_path / "deployment" / "logs" / "superlink.log").exists()


def test_a_failed_deployment_run_raises(tmp_path):
    with LocalDeployment(tmp_path / "deployment", n_supernodes=1, secure=False) as deployment:
        with pytest.raises(RuntimeError, match="failed"):
            deployment.run(tmp_path / "no_app_here", timeout=60)
