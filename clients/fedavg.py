"""FedAvg client: plain local SGD on cross-entropy; the base client is exactly FedAvg."""

from clients.base import BaseClient


class FedAvgClient(BaseClient):
    """Trains the whole model on the local split and uploads it."""
