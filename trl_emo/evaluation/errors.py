"""The evaluation's own error, in a module of its own so that every evaluation module (the configuration, the tasks,
the loaders) can raise it without importing the others."""


class EvaluationError(ValueError):
    """Data or models that the evaluation cannot use as given (missing column, missing folder...)."""
