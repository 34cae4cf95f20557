"""Runtime helpers every entry point shares: the Spark session (``spark``), atomic publishing of
outputs (``publish``), MLflow tracking (``tracking``) and progress logging (``logs``). Imports only
the contract (``prepared``)."""
