"""Names renamed before the first release are gone; files saved under them still load.

* the old constructor arguments (``beta``, ``tau``, ``m``, FedAvg-PG's ``m_in``/``m_h``/``m_out``,
  FedPG-BR's ``learning_rate``) are unknown keywords, and the old module paths
  (``fedrl_algos.per_fedavg``, ``base``, ``attacks``, ``fed_sb3``) do not import;
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
from fedrl_algos.common.model_file import LEGACY_MODULES

DATA = Path(__file__).parent / "data"
GRID = "fedrl/GridWorld-v0"
CLASSES = {"per_fedavg_pg": PerFedAvgPG, "fedavg_pg": FedAvgPG, "independent_pg": IndependentPG, "mfpo": MFPO, "fedpg_br": FedPGBR}


def _theta(model) -> torch.Tensor:
    return (model.agent_theta if isinstance(model, IndependentPG) else model.policy.theta).detach()


@pytest.mark.parametrize(
    "cls, old",
    [(PerFedAvgPG, "beta"), (PerFedAvgPG, "tau"), (FedAvgPG, "m_in"), (IndependentPG, "m"), (FedPGBR, "learning_rate"), (MFPO, "beta")],
)
def test_the_old_argument_names_are_gone(cls, old):
    # Renamed before any release (version 0.1.0): no alias is kept, Python's own TypeError names it.
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{old}'"):
        cls("TabularPolicy", GRID, device="cpu", **{old: 1})
    assert not hasattr(cls("TabularPolicy", GRID, seed=0, device="cpu"), "beta")


@pytest.mark.parametrize("module", ["fedrl_algos.per_fedavg", "fedrl_algos.base", "fedrl_algos.attacks", "fedrl_algos.fed_sb3"])
def test_the_old_module_paths_are_gone(module):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(module)
    # ...but files of SB3's pickle-based format that name them still unpickle (LEGACY_MODULES)
    assert module in LEGACY_MODULES and importlib.import_module(LEGACY_MODULES[module])


@pytest.mark.parametrize("name", list(CLASSES))
def test_models_saved_before_the_restructuring_load_and_continue(name):
    expected = json.loads((DATA / "algorithms_e06eef9_expected.json").read_text())[name]
    model = CLASSES[name].load(DATA / f"{name}_e06eef9.zip", device="cpu", allow_pickle=True)
    for attribute in model.obsolete_attributes + tuple(model.saved_attribute_renames):
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
