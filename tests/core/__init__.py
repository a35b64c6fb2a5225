"""The DTR core (tritondtr.core): driven directly with a counting executor
(tests/core_executor.py), and through the runtime where a rule shows end to end."""
