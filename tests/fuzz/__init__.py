"""The differential fuzzer (NOTE [ Differential fuzzer ] in check.py): random programs
(programs.py, from the line templates of templates/) and small networks (models.py) run
eagerly and under tritondtr (run.py), compared exactly (compare.py), with the open limits
left out by name (limits.py). ``python -m tests.fuzz`` runs seeds (cli.py) and ``python -m
tests.fuzz.reduce`` shrinks a failing program (reduce.py), both from the repository root;
the test_*.py files here run a fixed set of seeds and check the fuzzer itself."""
