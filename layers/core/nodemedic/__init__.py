"""NodeMedic core: contracts, domain logic and adapters shared by the stage Lambdas."""

__version__ = "0.1.0"
