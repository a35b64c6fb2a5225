"""The test suite, by subject (STYLE.md, Tests): one folder per layer of tritondtr (policy/,
engine/, core/, traceformat/, runtime/, sim/), app/ for the applications (demo, command
line), benchmarks/ for the benchmark scripts' own tests, and fuzz/, the differential fuzzer
and its tests. Each file is one subject; a regression test sits with its subject and names
its provenance in its docstring.

At the top: checks of the whole repository (test_layout.py: the import layers;
test_docs_notes.py: the index of NOTEs; test_readme.py: the README's commands), the budget
strings every layer reads (test_units.py), conftest.py, and the helpers several folders and
the benchmarks import as ``tests.<name>``: zoo.py (the model zoo), core_executor.py (a
counting executor for the core), twin_check.py (the twin's check of a recorded run) and
gpu_probes.py (the GPU probes benchmarks/gpu_check.py runs on CUDA)."""
