"""Spark ETL: raw recommender datasets to prepared, sharded user rows (the contract: prepared/schema.py)."""

__version__ = "0.1.0"
