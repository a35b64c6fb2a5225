"""The eviction policy (tritondtr.policy): the scoring rules and their torch twins, the Triton
kernels (tritondtr.kernels) against the twins, and the backend switch."""
