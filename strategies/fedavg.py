"""FedAvg strategy: the base strategy's defaults (whole model, sample-size weights)."""

from strategies.base import BaseStrategy


class FedAvg(BaseStrategy):
    """Sample-size-weighted average of whole client models (McMahan et al. 2017)."""
