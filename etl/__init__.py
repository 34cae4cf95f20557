"""Spark ETL: raw recommender datasets to prepared, sharded user rows (see etl/schema.py)."""

__version__ = "0.1.0"
