"""Models: one interface (``models.base.Recommender``) and a registry of classes by name
(``models.registry.MODELS``). A new model is one module here and one line in the registry."""
