"""``fedrl bench training``: whole rounds timed with exact step accounting, next to the bare env."""

import pytest

from fedrl_algos.bench_training import bench_training


def test_fedpg_br_round_is_timed_against_the_bare_env():
    (record,) = bench_training(configs=("fedpg_br-cartpole",), rounds=1, min_time=0.01, show=False)
    assert record.n_agents == 10 and record.envs_per_agent == 4 and record.rounds == 1
    assert record.env_steps > 0  # the timed round's own steps, warm-up excluded
    assert record.training_steps_per_s > 0 and record.bare_env_steps_per_s > 0
    assert record.fraction == pytest.approx(record.training_steps_per_s / record.bare_env_steps_per_s)


@pytest.mark.parametrize("kwargs, match", [({"configs": ("ppo-cartpole",)}, "configs"), ({"rounds": 0}, "rounds")])
def test_bad_arguments_name_themselves(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bench_training(show=False, **kwargs)
