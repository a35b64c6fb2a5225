"""The applications (tritondtr.demo, tritondtr.cli): the demo end to end and the command
line's errors."""
