"""The stores a sweep writes: the Optuna study and its trial records, the study lease, the
MLflow tracking store, and the retry policy every store write shares. Imports only ``sweeps.config``
(and ``sweeps.errors``)."""
