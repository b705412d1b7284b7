"""Deprecated names of the issue-11 restructuring keep working for one release, and old files load.

* renamed constructor arguments (``beta`` → ``step_size``, ``tau`` → ``local_steps``, ``m`` and
  FedAvg-PG's ``m_in``/``m_h``/``m_out`` → ``n_trajectories``, FedPG-BR's ``learning_rate`` →
  ``step_size``) warn and give bitwise the same training as the new names;
* the old attribute names read the new attributes, with a warning;
* the old module paths (``fedrl_algos.per_fedavg``, ``fedrl_algos.base``, ``fedrl_algos.attacks``)
  resolve to the moved objects, with a warning;
* models saved by the code before the restructuring (``tests/data/*_e06eef9.zip``, written at
  commit e06eef9 after two rounds) load, and one more round gives bitwise the parameters that
  code computed (``tests/data/algorithms_e06eef9_expected.json``).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch

from fedrl_algos import MFPO, FedAvgPG, FedPGBR, IndependentPG, PerFedAvgPG
from fedrl_algos.core import attacks as core_attacks

DATA = Path(__file__).parent / "data"
GRID = "fedrl/GridWorld-v0"
CLASSES = {"per_fedavg_pg": PerFedAvgPG, "fedavg_pg": FedAvgPG, "independent_pg": IndependentPG, "mfpo": MFPO, "fedpg_br": FedPGBR}


def _theta(model) -> torch.Tensor:
    return (model.agent_theta if isinstance(model, IndependentPG) else model.policy.theta).detach()


@pytest.mark.parametrize(
    "cls, old, new",
    [
        (PerFedAvgPG, dict(alpha=2.0, beta=0.3, tau=2, m_in=4, m_h=4, m_out=4), dict(alpha=2.0, step_size=0.3, local_steps=2, m_in=4, m_h=4, m_out=4)),
        (FedAvgPG, dict(beta=0.3, tau=2, m_in=4, m_h=2, m_out=3), dict(step_size=0.3, local_steps=2, n_trajectories=9)),
        (FedAvgPG, dict(m_in=5), dict(n_trajectories=25)),  # missing parts count 10, as before
        (IndependentPG, dict(beta=0.3, m=6, tau=2), dict(step_size=0.3, n_trajectories=6, local_steps=2)),
        (FedPGBR, dict(learning_rate=0.5, batch_range=(4, 6), inner_batch_size=2), dict(step_size=0.5, batch_range=(4, 6), inner_batch_size=2)),
    ],
)
def test_renamed_arguments_warn_and_train_identically(cls, old, new):
    with pytest.warns(DeprecationWarning, match="deprecated") as record:
        before = cls("TabularPolicy", GRID, seed=1, device="cpu", **old)
    assert all(str(w.filename) == __file__ for w in record)  # the warning points at the caller
    after = cls("TabularPolicy", GRID, seed=1, device="cpu", **new)
    assert torch.equal(_theta(before.learn(total_rounds=2)), _theta(after.learn(total_rounds=2)))
    assert before.num_timesteps == after.num_timesteps and before.trajectories_per_agent == after.trajectories_per_agent


def test_old_attribute_names_read_the_new_ones():
    model = PerFedAvgPG("TabularPolicy", GRID, step_size=0.3, local_steps=3, seed=0, device="cpu")
    with pytest.warns(DeprecationWarning, match=r"PerFedAvgPG\.beta .*\.step_size"):
        assert model.beta == 0.3
    with pytest.warns(DeprecationWarning, match="local_steps"):
        assert model.tau == 3
    with pytest.raises(AttributeError, match="no attribute 'gamma_'"):
        model.gamma_  # noqa: B018
    br = FedPGBR("TabularPolicy", GRID, step_size=0.5, batch_range=(4, 6), inner_batch_size=2, seed=0, device="cpu")
    with pytest.warns(DeprecationWarning, match="step_size"):
        assert br.server_learning_rate == 0.5
    assert br.step_size == 0.5  # and SB3's own ``learning_rate`` is not mistaken for it


def test_unknown_keyword_is_a_type_error():
    with pytest.raises(TypeError, match="unexpected keyword argument 'betta'"):
        PerFedAvgPG("TabularPolicy", GRID, betta=0.3, device="cpu")
    with pytest.raises(TypeError, match="unexpected keyword argument 'beta'"):
        MFPO("TabularPolicy", GRID, beta=0.3, device="cpu")  # MFPO never had it


@pytest.mark.parametrize(
    "module, name, new_module",
    [
        ("fedrl_algos.per_fedavg", "PerFedAvgPG", "fedrl_algos.per_fedavg_pg"),
        ("fedrl_algos.per_fedavg", "FedAvgPG", "fedrl_algos.fedavg_pg"),
        ("fedrl_algos.per_fedavg", "IndependentPG", "fedrl_algos.independent_pg"),
        ("fedrl_algos.base", "FederatedAlgorithm", "fedrl_algos.common"),
        ("fedrl_algos.base", "EnvFreeLearnMixin", "fedrl_algos.common"),
        ("fedrl_algos.attacks", "ATTACKS", "fedrl_algos.core.attacks"),
        ("fedrl_algos.attacks", "SignFlip", "fedrl_algos.core.attacks"),
    ],
)
def test_old_module_paths_resolve_with_a_warning(module, name, new_module):
    old = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=new_module.replace(".", r"\.")):
        value = getattr(old, name)
    assert value is getattr(importlib.import_module(new_module), name)
    with pytest.raises(AttributeError):
        old.no_such_name  # noqa: B018
    assert core_attacks.ATTACKS["sign_flip"] is core_attacks.SignFlip


@pytest.mark.parametrize("name", list(CLASSES))
def test_models_saved_before_the_restructuring_load_and_continue(name):
    expected = json.loads((DATA / "algorithms_e06eef9_expected.json").read_text())[name]
    model = CLASSES[name].load(DATA / f"{name}_e06eef9.zip", device="cpu", allow_pickle=True)
    for attribute in model.obsolete_attributes + tuple(model.renamed_attributes):
        assert attribute not in vars(model)  # migrated or dropped, not carried along
    model.learn(total_rounds=1, reset_num_timesteps=False)
    got, want = _theta(model).reshape(-1), torch.tensor(expected["theta_after_one_more_round"], dtype=_theta(model).dtype)
    if name == "mfpo":
        # MFPO's plain GPOMDP estimates now come from the tabular policy's closed-form score
        # gradient (the same sum, another float32 summation order) instead of autograd.
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6) and not torch.equal(got, want)
    else:
        assert torch.equal(got, want)
    assert model.num_timesteps == expected["num_timesteps"]
    assert model.trajectories_per_agent == expected["trajectories_per_agent"]
