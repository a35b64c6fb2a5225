"""The benchmarks' own tests (benchmarks/): the harness, the policy sweep and the GPU check at
toy sizes on the CPU. No timing is asserted."""
