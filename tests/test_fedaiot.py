"""FedAIoT protocol pieces (seed 004 chapter 2) that are not a loader, a model or a partitioner:
the centralized test (B13) and its validation."""

from __future__ import annotations

import pytest

from fedapps.config import load_config
from fedapps.errors import ConfigError
from fedapps.validation import validate


def test_clients_without_a_local_test_split_need_the_official_test() -> None:
    base = ["data.pool=official", "data.test-fraction=0"]
    validate(load_config("quickstart", [*base, "eval.official-test=true"]), check_data=False)
    with pytest.raises(ConfigError, match="data.test-fraction=0: 0 leaves clients no local "
                                          "test split: set eval.official-test=true"):
        validate(load_config("quickstart", base), check_data=False)
    with pytest.raises(ConfigError, match="eval.official-test=True: needs data.pool=official"):
        validate(load_config("quickstart", ["eval.official-test=true"]), check_data=False)
    with pytest.raises(ConfigError, match="eval.official-test=2: must be true, false"):
        validate(load_config("quickstart", ["eval.official-test=2"]), check_data=False)
