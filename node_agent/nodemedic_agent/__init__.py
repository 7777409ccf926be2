"""NodeMedic node agent: watches a GPU node and publishes Node Health Events to EventBridge."""

__version__ = "0.1.0"
